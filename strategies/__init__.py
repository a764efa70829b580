"""Built-in strategies, installed as ``flexgraph.strategies``.

Found through the ``flexgraph.strategies`` entry points, so nothing below imports this package.
"""
