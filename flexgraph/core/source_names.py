"""What a Python source file binds at its top level, read with :mod:`ast`, never run.

A module that may bind names its source does not show (a star import, a module
``__getattr__``, ``globals()``) is reported, so a missing name is unchecked, not wrong.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import attrs


@attrs.frozen
class ModuleNames:
    """The names a module's source binds at top level, and what may bind others."""

    bound: frozenset[str]
    classes: dict[str, frozenset[str]]  # class name -> names bound in its body (no bases)
    dynamic: str | None  # how the module may bind more names ("defines __getattr__"), or None


def _targets(node: ast.AST) -> Iterable[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _class_names(node: ast.ClassDef) -> frozenset[str] | None:
    """Names bound in a class body; ``None`` if it may inherit or be rewritten."""
    plain_bases = all(isinstance(b, ast.Name) and b.id == "object" for b in node.bases)
    if not plain_bases or node.keywords or node.decorator_list:
        return None
    names: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                names.update(_targets(target))
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            names.update(_targets(statement.target))
    return frozenset(names)


def _scan(statements: list[ast.stmt], names: set[str], classes: dict[str, Any],
          dynamic: list[str]) -> None:
    """Collect the names ``statements`` bind, entering blocks but not function bodies."""
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            if node.name == "__getattr__":
                dynamic.append("defines __getattr__")
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            classes[node.name] = _class_names(node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(_targets(target))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            if not isinstance(node, ast.AnnAssign) or node.value is not None:
                names.update(_targets(node.target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.asname or alias.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    dynamic.append(f"has 'from {node.module or '.'} import *'")
                else:
                    names.add(alias.asname or alias.name)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            names.update(_targets(node.target))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    names.update(_targets(item.optional_vars))
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            for handler in node.handlers:
                if handler.name:
                    names.add(handler.name)
                _scan(handler.body, names, classes, dynamic)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                _scan(block, names, classes, dynamic)


_BINDING_CALLS = ("globals", "locals", "vars", "exec", "setattr")


def _dynamic_binding(tree: ast.Module, name: str) -> str | None:
    """How ``name`` may be bound where the top-level statements do not show it, or ``None``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Global) and name in node.names:
            return f"declares 'global {name}' in a function"
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name) and (
            node.target.id == name
        ):
            return f"binds {name!r} with ':='"
        if getattr(node, "name", None) == name and type(node).__name__ in ("MatchAs", "MatchStar"):
            return f"binds {name!r} in a match pattern"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
            node.func.id in _BINDING_CALLS
        ):
            return f"calls {node.func.id}()"
        if isinstance(node, ast.Attribute) and node.attr == "modules" and isinstance(
            node.value, ast.Name
        ) and node.value.id == "sys":
            return "uses sys.modules"
    return None


@lru_cache(maxsize=256)
def _module_names(path: str, mtime_ns: int) -> ModuleNames:
    del mtime_ns  # part of the cache key only: an edited file is read again
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), filename=path)
    names: set[str] = set()
    classes: dict[str, Any] = {}
    dynamic: list[str] = []
    _scan(tree.body, names, classes, dynamic)
    return ModuleNames(frozenset(names), classes, " and ".join(dynamic) or None)


def module_names(path: str) -> ModuleNames:
    """What the Python source file ``path`` binds at top level (cached by mtime)."""
    return _module_names(path, os.stat(path).st_mtime_ns)


def binds_dynamically(path: str, name: str) -> str | None:
    """How ``path`` may bind ``name`` unseen, or ``None``; walks the whole tree, so asked last."""
    with open(path, "rb") as f:
        return _dynamic_binding(ast.parse(f.read(), filename=path), name)
