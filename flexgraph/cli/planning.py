"""Planning, as ``flexgraph plan`` and ``flexgraph run`` both do it.

Load the config (:func:`load_config`), choose the strategy
(:func:`choose_strategy`), then make the one plan: with the rewrites derived
from the files the run loads (:func:`derived_plan`: ``init_weights`` pruned when
they cover the model; it builds the model on the meta device, so torch is
imported), or without them (:func:`make_run_plan`, what ``flexgraph plan`` and
a launcher do). Derived rewrites are found before planning, from the config
alone, so a process plans once.

:func:`plan_digest` is what a launcher hands its ranks
(``FLEXGRAPH_PLAN_DIGEST``): it covers what the plan is made of (the base
graph, the strategy's rewrites and checks, the entry's targets), not the
rewrites a rank derives from the files it loads, which a launcher never reads.
"""

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

from flexgraph.cli.choice import default_strategy
from flexgraph.core.errors import FlexgraphError
from flexgraph.core.plan import Plan, make_plan
from flexgraph.core.rewrite import Rewrite
from flexgraph.core.strategy import Strategy

if TYPE_CHECKING:
    from flexgraph.core.graph import Graph
    from flexgraph.spec import Spec

__all__ = ["choose_strategy", "derived_plan", "load_config", "make_run_plan", "plan_digest"]


def _standard_graph(cfg: Any, entry: str) -> Graph:
    """The standard training graph, imported only for a cfg.py without ``steps``.

    Lazily, because the training package may import torch: a YAML spec or a
    pipeline script never needs it, and planning one must stay light.
    """
    from flexgraph.training.graph import standard_graph

    return standard_graph(cfg, entry=entry)


def load_config(config: str | os.PathLike[str] | Any,
                cfg_options: Mapping[str, Any] | None = None, *, entry: str = "train") -> Spec:
    """The spec of ``config``, as ``flexgraph plan``, ``flexgraph run`` and
    :class:`~flexgraph.runner.Runner` load it.

    Parameters
    ----------
    config : str, PathLike or Config
        Path of the YAML spec, pipeline script or cfg.py, or an MMEngine
        ``Config`` already read (a copy of it is planned: ``cfg_options`` never
        change the caller's).
    cfg_options : mapping, optional
        Config keys to override, parsed (:func:`~flexgraph.cli.options.parse_cfg_options`,
        plus what ``run``'s own flags set).
    entry : {"train", "val", "test"}, optional
        The standard graph's last step, for a training config without ``steps``.

    Returns
    -------
    Spec

    Raises
    ------
    FlexgraphError
        The spec layer's error for a config it cannot load.
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


def choose_strategy(spec: Spec, name: str | None, world_size: int = 1) -> Strategy | None:
    """The strategy ``name`` (the command line's), else the spec's, else the default for
    ``world_size`` processes (:func:`~flexgraph.cli.choice.default_strategy`)."""
    return spec.resolve_strategy(name or default_strategy(spec, world_size))


def make_run_plan(spec: Spec, strategy: Strategy | None, *, targets: tuple[str, ...] = (),
                  derived: tuple[Rewrite, ...] = ()) -> Plan:
    """Plan ``spec``'s graph under ``strategy`` (``None``: the base graph as declared).

    Raises
    ------
    FlexgraphError
        The engine's error, restated with the spec's file in front.
    """
    from flexgraph.spec.errors import restate

    try:
        return make_plan(spec.graph, strategy, targets=targets, derived=derived)
    except FlexgraphError as exc:
        raise restate(exc, str(spec.source)) from exc


def derived_plan(spec: Spec, strategy: Strategy | None, load_from: str | None,
                 targets: tuple[str, ...] = ()) -> tuple[Plan, dict[str, Any]]:
    """The plan, with the rewrites a run derives from its files, and what to say about them.

    The rewrites come first, from the config and the files
    (:func:`flexgraph.training.checkpoint.derive_from_weights`: imports torch,
    builds the model on the meta device, reads each file's index), then the
    one plan is made with them.

    Parameters
    ----------
    spec, strategy:
        The spec and its strategy.
    load_from:
        What ``load_checkpoint`` loads (``RunSettings.weights_to_load()``).
    targets:
        The plan's targets (an entry point's).

    Returns
    -------
    tuple of (Plan, dict)
        The plan, and ``{"pruned": {step: reason}, "notes": {step: line}}``
        with the empty parts left out.
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
    """A digest of what the plan is made of: the base graph, the strategy, the targets.

    Launcher and ranks compute it from the same inputs, before any rank derives
    rewrites from its files. Sets are sorted and object addresses in reprs
    (``<... at 0x7f...>``) left out: both differ between processes without
    meaning anything.
    """
    from flexgraph.render.json_view import json_safe

    made_of = [_fields(spec.graph), _fields(strategy), list(targets)]
    text = json.dumps(json_safe(made_of), sort_keys=True)
    return hashlib.sha256(re.sub(r" at 0x[0-9a-fA-F]+", "", text).encode()).hexdigest()[:16]


def _fields(value: Any) -> Any:
    return None if value is None else attrs.asdict(value)  # collections kept: sets are sorted below
