"""MMEngine-style ``cfg.py`` configs, read with mmengine's own ``Config``.

So OpenMMLab configs (``_base_``, ``custom_imports``, ``--cfg-options``) work
unchanged. flexgraph reads ``steps`` (else ``default_graph(cfg)``),
``custom_steps``, ``strategies``, ``strategy`` and ``inputs``; the Config itself
is the ``cfg`` input.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph
from flexgraph.spec.checks import Where, plain
from flexgraph.spec.errors import (
    SpecConfigError,
    SpecImportError,
    SpecNoGraphError,
    SpecScriptError,
    SpecSyntaxError,
    restate,
)
from flexgraph.spec.model import Spec
from flexgraph.spec.steps import graph_of, steps_from_list
from flexgraph.spec.toplevel import build_spec, extend_graph, inputs_from_data

DefaultGraph = Callable[[Any], Graph]


def _one_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _location(exc: BaseException, path: Path, shown: str) -> str:
    """Where in the config or its ``_base_`` files ``exc`` arose: the deepest frame mmengine ran."""
    filename, line = None, None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_name == "<module>":
            filename, line = frame.f_code.co_filename, lineno
        elif frame.f_code.co_name in ("_file2dict", "_is_lazy_import"):
            filename, line = frame.f_locals.get("filename"), None
    if isinstance(exc, SyntaxError) and exc.filename in (None, "<unknown>"):
        line = exc.lineno
    if not filename or os.path.abspath(filename) == os.path.abspath(path):
        return f"{shown}:{line}" if line else shown
    return f"{shown}: in {filename}" + (f":{line}" if line else "")


def read_config(path: Path, shown: str, cfg_options: dict[str, Any] | None) -> Any:
    """``Config.fromfile(path)`` with ``cfg_options`` merged; failures name the file."""
    from mmengine.config import Config

    try:
        cfg = Config.fromfile(str(path))
    except SyntaxError as exc:
        message = exc.msg if exc.filename in (None, "<unknown>") else _one_line(exc)
        where = _location(exc, path, shown)
        raise SpecSyntaxError(f"{where}: Python syntax error: {message}") from exc
    except ImportError as exc:
        cause = exc.__cause__ or exc
        raise SpecImportError(f"{shown}: custom_imports failed: {_one_line(cause)}") from exc
    except (FileNotFoundError, KeyError) as exc:
        raise SpecConfigError(f"{shown}: mmengine cannot read the config: {exc}") from exc
    except Exception as exc:
        where = _location(exc, path, shown)
        raise SpecScriptError(
            f"{where}: the config raised {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    if cfg_options:
        try:
            cfg.merge_from_dict(cfg_options)
        except Exception as exc:
            raise SpecConfigError(f"{shown}: --cfg-options: {_one_line(exc)}") from exc
    return cfg


def _base_graph(cfg: Any, where: Where, inputs: list[str], default: DefaultGraph | None) -> Graph:
    if cfg.get("steps") is not None:
        return graph_of(steps_from_list(plain(cfg["steps"]), where, "steps"), inputs, where)
    if default is None:
        raise SpecNoGraphError(
            f"{where}: the config has no 'steps' and no default graph was given "
            "(the CLI uses the standard training graph)"
        )
    try:
        return default(cfg).with_inputs(*inputs)
    except FlexgraphError as exc:
        raise restate(exc, f"{where}: default graph") from exc


def load_cfg_spec(
    path: Path,
    shown: str,
    cfg_options: dict[str, Any] | None = None,
    default_graph: DefaultGraph | None = None,
) -> Spec:
    return config_spec(read_config(path, shown, cfg_options), shown, default_graph)


def config_spec(cfg: Any, shown: str, default_graph: DefaultGraph | None = None) -> Spec:
    """The :class:`Spec` of a Config already read (``shown`` names it in messages)."""
    where = Where(shown)
    data = {key: plain(cfg.get(key)) for key in ("strategies", "strategy", "inputs")}
    declared = inputs_from_data(data["inputs"], where)
    graph = _base_graph(cfg, where, list(declared), default_graph)
    if cfg.get("custom_steps") is not None:
        graph = extend_graph(graph, plain(cfg["custom_steps"]), where, "custom_steps")
    needs_cfg = any("cfg" in s.inputs for s in graph) and "cfg" not in graph.producers
    if needs_cfg:
        graph = graph.with_inputs("cfg")
    return build_spec(data, graph, where, {**declared, "cfg": cfg}, cfg=cfg)
