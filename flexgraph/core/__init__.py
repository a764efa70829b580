"""The engine: pure Python (attrs, networkx), importing no layer above it, naming no strategy."""
