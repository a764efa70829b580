"""The engine: steps, graphs, rewrites, strategies, plans and the executor.

Pure Python (attrs and networkx): it imports no layer above it and knows no
strategy by name (an import-linter contract keeps it so).
"""
