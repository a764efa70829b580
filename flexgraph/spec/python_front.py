"""Python-API scripts: a ``.py`` file that builds the graph with flexgraph's own API.

Such a script binds a top-level ``pipeline`` (a :class:`Graph`, a :class:`Spec`,
or a function returning one). It runs as if imported (``__name__`` is its
stem), so its ``__main__`` block stays out and its functions get importable names.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph
from flexgraph.core.rewrite import Rewrite
from flexgraph.core.strategy import Strategy
from flexgraph.spec.checks import Where, type_name
from flexgraph.spec.errors import (
    SpecPipelineError,
    SpecScriptError,
    SpecSyntaxError,
    SpecTypeError,
    SpecValueError,
    restate,
)
from flexgraph.spec.model import Spec
from flexgraph.spec.toplevel import apply_options, inputs_from_data, strategy_choice

RUN_NAME = "__flexgraph_spec__"
"""``__name__`` of a script whose stem is taken by another module (``json.py``)."""


def run_name(path: Path) -> str:
    """The script's stem, unless that would shadow a different module."""
    stem = path.stem
    if not stem.isidentifier() or stem in sys.stdlib_module_names:
        return RUN_NAME
    try:
        found = importlib.util.find_spec(stem)
    except (ImportError, ValueError):
        return RUN_NAME
    if found is None or (found.origin and os.path.samefile(found.origin, path)):
        return stem
    return RUN_NAME


def parse_python(path: Path, shown: str) -> ast.Module:
    """Parse ``path``; a syntax error becomes a :class:`SpecSyntaxError` with the line."""
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=shown)
    except SyntaxError as exc:
        raise SpecSyntaxError(f"{shown}:{exc.lineno}: Python syntax error: {exc.msg}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise SpecSyntaxError(f"{shown}: cannot read the file as Python source: {exc}") from exc


def defines_pipeline(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            targets = [ast.Name(node.name)]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            targets = [ast.Name(a.asname or a.name) for a in node.names]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "pipeline" for t in targets):
            return True
    return False


def _failure_line(exc: BaseException, path: Path) -> str:
    """``:LINE`` of the deepest frame of ``exc`` inside ``path``, or ``''``."""
    line = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == os.path.abspath(path):
            line = f":{frame.lineno}"
    return line


def script_error(exc: BaseException, path: Path, shown: str, what: str) -> Exception:
    """The spec error for ``exc``, raised while ``what`` ran: it names the file and line."""
    if isinstance(exc, SyntaxError):
        return SpecSyntaxError(f"{shown}:{exc.lineno}: Python syntax error: {exc.msg}")
    if isinstance(exc, FlexgraphError):
        return restate(exc, f"{shown}{_failure_line(exc, path)}")
    return SpecScriptError(
        f"{shown}{_failure_line(exc, path)}: {what} raised {type(exc).__name__}: {exc}"
    )


def call_reporting(func: Callable[[], Any], path: Path, shown: str, what: str) -> Any:
    """Call ``func``; what it raises becomes :func:`script_error` (the cause chained)."""
    try:
        return func()
    except (Exception, SystemExit) as exc:  # a script's sys.exit() must not end the CLI
        raise script_error(exc, path, shown, what) from exc


def _graph_or_spec(value: Any, path: Path, shown: str) -> Graph | Spec:
    if callable(value) and not isinstance(value, Graph | Spec):
        try:
            inspect.signature(value).bind()
        except TypeError:
            raise SpecPipelineError(
                f"{shown}: 'pipeline' is a function that needs arguments; "
                "make it take none (or assign the Graph itself)"
            ) from None
        except ValueError:  # no signature to inspect (a builtin): just call it
            pass
        value = call_reporting(value, path, shown, "calling pipeline()")
    if not isinstance(value, Graph | Spec):
        raise SpecPipelineError(
            f"{shown}: 'pipeline' must be a flexgraph Graph or Spec, or a function "
            f"returning one; got {type_name(value)}"
        )
    return value


def _strategies(value: object, where: Where) -> dict[str, Strategy]:
    if not isinstance(value, Mapping):
        raise SpecTypeError(f"{where}: 'strategies' must be a dict, not {type_name(value)}")
    found = {}
    for name, body in value.items():
        at = f"{where}: strategies[{name!r}]"
        if isinstance(body, list | tuple) and all(isinstance(r, Rewrite) for r in body):
            body = Strategy(name, body)
        if not isinstance(body, Strategy):
            raise SpecTypeError(f"{at} must be a Strategy or a list of rewrites")
        if body.name != name:
            raise SpecValueError(f"{at} is a Strategy named {body.name!r}; use one name")
        found[name] = body
    return found


def load_python_spec(path: Path, shown: str, cfg_options: dict[str, Any] | None = None) -> Spec:
    """Run the script and collect its ``pipeline``, ``strategies``, ``strategy``, ``inputs``."""
    where = Where(shown)
    name = run_name(path)
    namespace = call_reporting(
        lambda: runpy.run_path(str(path), run_name=name), path, shown, "running the script"
    )
    if "pipeline" not in namespace:
        raise SpecPipelineError(f"{shown}: the script did not define 'pipeline' when run")
    pipeline = _graph_or_spec(namespace["pipeline"], path, shown)
    given = [k for k in ("strategies", "strategy", "inputs") if k in namespace]
    if isinstance(pipeline, Spec):
        if given:
            raise SpecPipelineError(
                f"{shown}: 'pipeline' is a Spec, so '{given[0]}' belongs inside it"
            )
        return attrs.evolve(
            pipeline, source=shown, inputs=apply_options(pipeline.inputs, cfg_options)
        )
    strategies = _strategies(namespace.get("strategies", {}), where)
    choice = namespace.get("strategy")
    if isinstance(choice, Strategy):
        strategies.setdefault(choice.name, choice)
        choice = choice.name
    inputs = inputs_from_data(namespace.get("inputs"), where)
    return Spec(
        graph=pipeline.with_inputs(*inputs),
        strategies=strategies,
        strategy=strategy_choice(choice, where),
        inputs=apply_options(inputs, cfg_options),
        source=shown,
    )
