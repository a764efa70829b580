"""The engine: steps, graphs, rewrites, strategies, plans and the executor.

Pure Python (attrs and networkx). It never imports torch, mmengine, deepspeed
or any layer above it, and knows no strategy by name; an import-linter contract
in pyproject.toml keeps it so.
"""
