'''The plan as JSON: a stable schema for tools, CI checks and other languages.

``flexgraph plan CONFIG --format json`` prints :func:`plan_json`. The schema is
versioned by its ``"schema"`` key; fields are only ever added under one
version, never renamed or removed. Keys appear in the order below, lists in the
order described, so the same plan always serialises to the same bytes.

Schema ``flexgraph.plan/1``::

    {
      "schema": "flexgraph.plan/1",
      "strategy": "ddp",                # or null when no strategy was applied
      "steps": [                        # in execution order
        {
          "name": "wrap_model",
          "fn": "module:qualname",      # the function reference, as text
          "requires": ["cfg"],          # artifacts read
          "provides": [],               # artifacts created
          "updates": ["model"],         # artifacts read and replaced in place
          "after": ["load_checkpoint"], # explicit ordering edges, by step name
          "before": [],
          "params": {"device": "cpu"},  # bound keyword arguments, JSON-safe
          "stage": 3,                   # 0-based index into "stages"
          "origin": "base"              # or, for a step a rewrite placed/changed:
                                        # {"action": "replaced", "strategy": "ddp",
                                        #  "index": 0, "rewrite": "replace ..."}
        }
      ],
      "rewrites": [                     # in the order they were applied
        {
          "index": 0,                   # 0-based position in the strategy
          "strategy": "ddp",            # "derived": a rewrite derived from the run's
                                        # inputs (a prune, with its reason), applied
                                        # before the strategy's
          "kind": "replace",            # insert|remove|prune|replace|move|fuse|configure
          "description": "replace wrap_model with (...)",
          "touched": {"wrap_model": "replaced"},  # step -> action
          "consumed": {}                # steps taken out -> the step in their place
                                        # (null for a removal)
        }
      ],
      "stages": [["setup_env"], ["build_model"]],  # topological generations
      "base_order": ["setup_env", "..."],          # the base graph's order
      "edges": [                        # sorted by source, then target position
        {"source": "build_model", "target": "init_weights",
         "reason": "init_weights updates model, made by build_model"}
      ],
      "notes": {                        # only when the caller has any: step -> what
        "load_checkpoint": "load_from '...' is read as ..."  # it will do with the
      }                                 # run's inputs (training: the reader of a path)
    }

``origin`` is the step's latest origin: ``action`` is one of ``inserted``,
``moved``, ``replaced``, ``fused``, ``configured``; ``index`` is 0-based (the
text views print it 1-based, as ``ddp #1``). ``params`` values that JSON cannot
hold are written as their ``repr`` (non-finite floats too); tuples become
lists, sets sorted lists, mappings with non-string keys their ``repr``.
'''

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from flexgraph.core.plan import Plan
from flexgraph.render._changes import ordered_edges

SCHEMA = "flexgraph.plan/1"
"""The value of the ``"schema"`` key; bumped only for an incompatible change."""


def json_safe(value: Any) -> Any:
    """Return ``value`` as something :func:`json.dumps` writes deterministically.

    Parameters
    ----------
    value : object
        A step parameter (any Python value).

    Returns
    -------
    object
        ``None``, bools, ints, finite floats and strings as they are; lists and
        tuples as lists; sets as lists sorted by ``repr``; mappings with string
        keys as dicts (recursively); anything else as its ``repr``.
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


def plan_to_dict(plan: Plan, notes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return ``plan`` as a JSON-ready dict in the ``flexgraph.plan/1`` schema.

    Parameters
    ----------
    plan : Plan
    notes : mapping of str to str, optional
        A line per step about what it will do with the run's inputs (``notes``;
        left out when empty), in plan order.

    Returns
    -------
    dict
        See the module docstring for every key.
    """
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
                "origin": "base" if origin.action == "base" else origin.to_dict(),
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
    """Return ``plan`` as JSON text (indent 2, keys in schema order, no trailing newline).

    Parameters
    ----------
    plan : Plan
    notes : mapping of str to str, optional
        See :func:`plan_to_dict`.

    Returns
    -------
    str
        :func:`plan_to_dict` serialised; byte-identical for equal plans.
    """
    return json.dumps(plan_to_dict(plan, notes), indent=2, allow_nan=False)
