"""Built-in strategies, installed as ``flexgraph.strategies``.

A strategy is a factory returning a :class:`flexgraph.Strategy` and the step
functions only it knows. The CLI finds factories through the
``flexgraph.strategies`` entry points (:mod:`flexgraph.strategies.names`), so
nothing below it imports this package.
"""
