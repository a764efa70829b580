"""Built-in strategies, installed as ``flexgraph.strategies``.

Each module is one strategy: a factory returning a :class:`flexgraph.Strategy`
(its rewrites) and the step functions only it knows. They are registered as
entry points in the ``flexgraph.strategies`` group, so nothing below the CLI
imports this package.
"""
