"""``load_spec``: one entry point for the three kinds of pipeline file.

A ``.py`` file that binds a top-level ``pipeline`` (read with :mod:`ast`, not
run) is a Python-API script, any other an MMEngine-style config. The file's
folder goes first on ``sys.path``, so its imports find their sibling modules.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexgraph.core.graph import Graph
from flexgraph.spec.errors import SpecFormatError, SpecNotFoundError
from flexgraph.spec.model import Spec

SUFFIXES = (".yaml", ".yml", ".py")


def put_folder_on_path(path: Path) -> None:
    """Put ``path``'s folder at the front of ``sys.path`` (once)."""
    folder = str(path.resolve().parent)
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)


def base_files(path: Path, seen: set[Path] | None = None) -> list[Path]:
    """A cfg.py's ``_base_`` files, nearest first (their ``custom_imports`` need their folders)."""
    seen = set() if seen is None else seen
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return []  # mmengine reports it, with the file and line
    found: list[Path] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_base_" for t in node.targets):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    base = (path.parent / item.value).resolve()
                    if base not in seen and base.is_file():
                        seen.add(base)
                        found += [base, *base_files(base, seen)]
    return found


def load_spec(
    path: str | Path,
    cfg_options: dict[str, Any] | None = None,
    default_graph: Callable[[Any], Graph] | None = None,
) -> Spec:
    """Load a YAML spec, a Python-API script or an MMEngine-style cfg.py."""
    path = Path(path)
    shown = str(path)
    if path.suffix not in SUFFIXES:
        raise SpecFormatError(
            f"{shown}: unknown kind of spec {path.suffix or '(no suffix)'!r}; "
            "expected .yaml / .yml (YAML spec) or .py (Python script or cfg.py)"
        )
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise SpecNotFoundError(f"{shown}: the spec file {what}")
    for base in reversed(base_files(path) if path.suffix == ".py" else []):
        put_folder_on_path(base)
    put_folder_on_path(path)
    if path.suffix != ".py":
        from flexgraph.spec.yaml_front import load_yaml_spec

        return load_yaml_spec(path, shown, cfg_options)
    from flexgraph.spec.python_front import defines_pipeline, load_python_spec, parse_python

    if defines_pipeline(parse_python(path, shown)):
        return load_python_spec(path, shown, cfg_options)
    from flexgraph.spec.cfg_front import load_cfg_spec

    return load_cfg_spec(path, shown, cfg_options, default_graph)
