"""The ``flexgraph`` command line (``flexgraph plan``, ``flexgraph run``, ``flexgraph ckpt``).

The entry point is :func:`flexgraph.cli.main.main`; each subcommand lives in its
own module (``plan_cmd``, ``run_cmd``, ``ckpt_cmd``) with an
``add_arguments(parser)`` and a command function that returns the exit status.
``plan`` and ``run`` load, choose a strategy and plan one way
(:mod:`flexgraph.cli.planning`). ``run`` makes the run's context
(:class:`~flexgraph.training.output.RunContext`) once, after planning, from
what it parsed and found out about its launch, and passes it down; it never
writes into the parsed arguments. ``--cfg-options`` parsing is in
:mod:`flexgraph.cli.options`, the plain-when-piped console in
:mod:`flexgraph.cli.console`. Nothing here is imported by the layers below.
"""
