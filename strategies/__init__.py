"""Built-in strategies, installed as ``flexgraph.strategies``; found through its entry points."""
