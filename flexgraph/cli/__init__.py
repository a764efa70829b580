"""The ``flexgraph`` command line (``flexgraph plan``, ``flexgraph run``).

The entry point is :func:`flexgraph.cli.main.main`; each subcommand lives in its
own module (``plan_cmd``, ``run_cmd``) with an ``add_arguments(parser)`` and a
command function that returns the exit status. ``--cfg-options`` parsing is in
:mod:`flexgraph.cli.options`, the plain-when-piped console in
:mod:`flexgraph.cli.console`. Nothing here is imported by the layers below.
"""
