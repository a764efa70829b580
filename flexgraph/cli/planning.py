"""Planning, as ``flexgraph plan`` and ``flexgraph run`` both do it."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.plan import Plan, make_plan
from flexgraph.core.rewrite import Rewrite
from flexgraph.core.strategy import Strategy

if TYPE_CHECKING:
    from flexgraph.core.graph import Graph
    from flexgraph.spec import Spec


def _standard_graph(cfg: Any, entry: str) -> Graph:
    """The standard training graph, imported only when needed (it may import torch)."""
    from flexgraph.training.graph import standard_graph

    return standard_graph(cfg, entry=entry)


def load_config(config: str | os.PathLike[str] | Any,
                cfg_options: Mapping[str, Any] | None = None, *, entry: str = "train") -> Spec:
    """The spec of ``config`` (a path, or an MMEngine ``Config``, copied).

    ``entry`` is the standard graph's last step.
    """
    default_graph = functools.partial(_standard_graph, entry=entry)
    if isinstance(config, (str, os.PathLike)):
        from flexgraph.spec import load_spec

        return load_spec(Path(config), cfg_options=dict(cfg_options or {}) or None,
                         default_graph=default_graph)
    from flexgraph.spec.cfg_front import config_spec

    cfg = copy.deepcopy(config)
    if cfg_options:
        cfg.merge_from_dict(dict(cfg_options))
    return config_spec(cfg, cfg.filename or "<config>", default_graph)


def default_strategy(spec: Any, world_size: int = 1) -> str | None:
    """The strategy when neither the command line nor the spec names one, or ``None``.

    ``plan`` and ``run`` share it, so the plan printed is the plan run: a cfg.py on
    the standard training graph gets ``single``, or ``ddp`` with more than one process.
    """
    if spec.strategy is not None or spec.cfg is None or "steps" in spec.cfg:
        return None
    return "ddp" if world_size > 1 else "single"


def choose_strategy(spec: Spec, name: str | None, world_size: int = 1) -> Strategy | None:
    """The strategy ``name``, else the spec's, else the default for ``world_size``."""
    return spec.resolve_strategy(name or default_strategy(spec, world_size))


def make_run_plan(spec: Spec, strategy: Strategy | None, *, targets: tuple[str, ...] = (),
                  derived: tuple[Rewrite, ...] = ()) -> Plan:
    """Plan ``spec``'s graph under ``strategy``; errors name the spec's file."""
    from flexgraph.spec.errors import restate

    try:
        return make_plan(spec.graph, strategy, targets=targets, derived=derived)
    except FlexgraphError as exc:
        raise restate(exc, str(spec.source)) from exc


def derived_plan(spec: Spec, strategy: Strategy | None, load_from: str | None,
                 targets: tuple[str, ...] = ()) -> tuple[Plan, dict[str, Any]]:
    """The plan with the rewrites a run derives from its files, and what to say about them.

    The second is ``{"pruned": {step: reason}, "notes": {step: line}}``, empty parts left out.
    """
    if spec.cfg is None or strategy is None or not strategy.prunable:
        return make_run_plan(spec, strategy, targets=targets), {}
    from flexgraph.render import pruned_steps
    from flexgraph.training.checkpoint import derive_from_weights

    derivation = derive_from_weights(spec.cfg, load_from, strategy.prunable)
    plan = make_run_plan(spec, strategy, targets=targets, derived=derivation.rewrites)
    said = {"pruned": pruned_steps(plan), "notes": dict(derivation.notes)}
    return plan, {k: v for k, v in said.items() if v}


def plan_digest(spec: Spec, strategy: Strategy | None, targets: tuple[str, ...] = ()) -> str:
    """A digest of the base graph, the strategy and the targets.

    Sets are sorted and object addresses left out, as both differ between processes.
    """
    from flexgraph.render.json_view import json_safe

    made_of = [_fields(spec.graph), _fields(strategy), list(targets)]
    text = json.dumps(json_safe(made_of), sort_keys=True)
    return hashlib.sha256(re.sub(r" at 0x[0-9a-fA-F]+", "", text).encode()).hexdigest()[:16]


def _fields(value: Any) -> Any:
    return None if value is None else attrs.asdict(value)  # collections kept: sets are sorted below
