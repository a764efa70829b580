"""The ``flexgraph`` command line (``flexgraph plan``, ``flexgraph run``, ``flexgraph ckpt``).

The entry point is :func:`flexgraph.cli.main.main`; each subcommand's module
has an ``add_arguments(parser)`` and a command function returning the exit
status. Nothing here is imported by the layers below.
"""
