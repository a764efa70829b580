"""The ``flexgraph`` command line; nothing here is imported by the layers below."""
