'''The plan as JSON (``flexgraph plan --format json``): a stable schema for tools and CI.

Fields are only ever added under one ``"schema"`` version, never renamed or
removed. Keys come in the order below, so a plan always gives the same bytes.
Schema ``flexgraph.plan/2``::

    {
      "schema": "flexgraph.plan/2",
      "strategy": "ddp",                # or null
      "steps": [                        # in execution order
        {
          "name": "wrap_model",
          "fn": "module:qualname",
          "requires": ["cfg"], "provides": [], "updates": ["model"],
          "after": ["load_checkpoint"], "before": [],
          "params": {"device": "cpu"},  # bound keyword arguments, JSON-safe
          "stage": 3,                   # 0-based index into "stages"
          "origin": "base",             # "base", "user" (a step the user added), or the
                                        # latest origin: {"action": "replaced",
                                        #  "strategy": "ddp", "index": 0, "rewrite": "..."}
          "user": false,                # the user added it (custom_steps)
          "gives": ["on_device"],       # facts about the model it makes true
          "ends": ["unwrapped"],        # ... and false
          "needs": [],                  # facts it declares it needs of the model it receives
          "implied_needs": [],          # what a user's name anchors mean in the base graph
          "state": ["initialised", "loaded", "on_device", "whole"]  # the model's facts
        }                               # after this step, null before the model exists
      ],
      "rewrites": [                     # in the order applied, skipped ones included
        {
          "index": 0,                   # 0-based position in the strategy
          "strategy": "ddp",            # or "derived" (from the run's inputs, applied first)
          "kind": "replace",            # insert|remove|prune|replace|move|fuse|configure
          "description": "replace wrap_model with (...)",
          "touched": {"wrap_model": "replaced"},  # step -> action
          "consumed": {},               # step taken out -> the step in its place, or null
          "why": "...",                 # its reason ("" when it gives none)
          "applied": true,              # false: a conditional rewrite that did not apply
          "skipped": null,              # why it did not ("init_weights is planned")
          "steps": ["wrap_model"]       # the steps it names or brings in
        }
      ],
      "stages": [["setup_env"], ["build_model"]],  # topological generations
      "base_order": ["setup_env", "..."],
      "edges": [                        # sorted by source, then target position
        {"source": "build_model", "target": "init_weights",
         "reason": "init_weights updates model, made by build_model"}
      ],
      "notes": {"load_checkpoint": "..."}  # only if any: step -> what it will do
    }                                      # with the run's inputs

An origin's ``action`` is ``inserted``, ``moved``, ``replaced``, ``fused``,
``configured``, or ``placed`` (a user's step placed by its needs rather than
at its anchors: ``strategy`` is ``"need"``, ``index`` null and ``rewrite``
says where and why). ``params`` values JSON cannot hold (non-finite floats
included) are written as their ``repr``; see :func:`json_safe`.

``flexgraph.plan/1`` had no facts, reasons or user marks, and its ``origin``
was never ``"user"``; its readers (a portable checkpoint's manifest, resume's
plan-change log) read only the fields both versions share.
'''

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from flexgraph.core.plan import Origin, Plan
from flexgraph.render._changes import ordered_edges

SCHEMA = "flexgraph.plan/2"
"""The value of the ``"schema"`` key; bumped only for an incompatible change."""


def json_safe(value: Any) -> Any:
    """``value`` as something :func:`json.dumps` writes deterministically.

    Sets become lists sorted by ``repr``; anything else JSON cannot hold becomes its ``repr``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [json_safe(v) for v in sorted(value, key=repr)]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: json_safe(v) for k, v in value.items()}
    return repr(value)


def _origin(origin: Origin, user: str) -> Any:
    if origin.action != "base":
        return origin.to_dict()
    return "user" if user else "base"


def _state(state: tuple[str, ...] | None) -> list[str] | None:
    return None if state is None else list(state)


def plan_to_dict(plan: Plan, notes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``plan`` as a JSON-ready dict in the ``flexgraph.plan/2`` schema."""
    stage_of = {name: i for i, stage in enumerate(plan.stages) for name in stage}
    steps = []
    for step in plan.steps:
        origin = plan.origin(step.name)
        steps.append(
            {
                "name": step.name,
                "fn": step.fn_name,
                "requires": list(step.requires),
                "provides": list(step.provides),
                "updates": list(step.updates),
                "after": list(step.after),
                "before": list(step.before),
                "params": json_safe(dict(step.params)),
                "stage": stage_of[step.name],
                "origin": _origin(origin, step.user),
                "user": bool(step.user),
                "gives": list(step.gives),
                "ends": list(step.ends),
                "needs": list(step.needs),
                "implied_needs": list(plan.implied.get(step.name, ())),
                "state": _state(plan.states.get(step.name)),
            }
        )
    out = {
        "schema": SCHEMA,
        "strategy": plan.strategy,
        "steps": steps,
        "rewrites": [
            {
                "index": applied.index,
                "strategy": applied.strategy,
                "kind": applied.kind,
                "description": applied.description,
                "touched": dict(applied.touched),
                "consumed": dict(applied.consumed),
                "why": applied.why,
                "applied": applied.applied,
                "skipped": applied.skipped,
                "steps": list(applied.steps),
            }
            for applied in plan.rewrites
        ],
        "stages": [list(stage) for stage in plan.stages],
        "base_order": list(plan.base_order),
        "edges": [
            {"source": e.source, "target": e.target, "reason": e.reason}
            for e in ordered_edges(plan)
        ],
    }
    if notes:
        out["notes"] = {name: notes[name] for name in plan.order if name in notes}
    return out


def plan_json(plan: Plan, notes: Mapping[str, str] | None = None) -> str:
    """``plan`` as JSON text (indent 2, schema order, no trailing newline)."""
    return json.dumps(plan_to_dict(plan, notes), indent=2, allow_nan=False)
