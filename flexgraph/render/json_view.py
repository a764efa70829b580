"""The plan as JSON (``flexgraph plan --format json``): a stable schema for tools and CI.

Fields are only ever added under one ``"schema"`` version, never renamed or
removed; keys come in a fixed order, so a plan always gives the same bytes. The
schema, ``flexgraph.plan/2``, is in ``docs/guide/plans.rst``.
"""

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
    """``value`` for :func:`json.dumps`, deterministic: sets sorted, the unknown as ``repr``."""
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
