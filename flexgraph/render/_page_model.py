"""What the plan page draws, read from the plan's JSON dict (``flexgraph.plan/1`` or later).

The page is drawn from the dict rather than the :class:`~flexgraph.Plan`, so a
run's recorded ``plan.json`` draws the same. Fields a later schema adds are
drawn where present and skipped where absent: a step's model ``state`` (or the
``gives`` / ``ends`` it is walked from) and ``needs``, a rewrite's ``why`` and
``skipped``, a ``user`` origin. A conditional rewrite that changed nothing is
shown as skipped, its condition in words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flexgraph.render._align import aligned_rows
from flexgraph.render._changes import passed_artifacts

PRIORITY = ("moved", "inserted", "fused", "replaced", "configured")
"""Which end of an order a check's reason is shown at: the end touched first in this list."""


@attrs.frozen
class Change:
    """One rewrite as it touched a step (or as it was skipped)."""

    label: str
    action: str
    text: str
    why: str = ""


@attrs.frozen
class Box:
    """A step as the picture draws it, in one of the two orders."""

    name: str
    position: int
    action: str
    doc: str = ""
    parts: tuple[str, ...] = ()
    facts: tuple[str, ...] = ()
    gained: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


@attrs.frozen
class Edge:
    """A derived edge of the plan, with the artifacts it passes."""

    source: str
    target: str
    reason: str
    artifacts: tuple[str, ...]


@attrs.frozen
class PageModel:
    """The plan as the page shows it: rows of boxes, each step's changes and reasons."""

    strategy: str | None
    rows: tuple[tuple[Box | None, Box | None], ...]
    changes: Mapping[str, tuple[Change, ...]]
    reasons: Mapping[str, tuple[str, ...]]
    rewrites: tuple[Change, ...]
    edges: tuple[Edge, ...]
    fused_parts: Mapping[str, str]
    has_state: bool

    @property
    def skipped(self) -> tuple[Change, ...]:
        return tuple(c for c in self.rewrites if c.action == "skipped")

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(b.name for _, b in self.rows if b is not None)


def _action_of(origin: Any) -> str:
    if origin == "user" or (isinstance(origin, Mapping) and origin.get("action") == "user"):
        return "user"
    return "base"


_CONDITION = re.compile(r", when (\w+) is (not )?planned$")


def _skipped_because(rewrite: Mapping[str, Any]) -> str | None:
    """Why a rewrite changed nothing (``None``: it did change something)."""
    if rewrite.get("skipped"):
        return str(rewrite["skipped"])
    if rewrite.get("touched") or rewrite.get("consumed") or rewrite.get("applied") is True:
        return None
    found = _CONDITION.search(rewrite["description"])
    if found is None:
        return "it changed nothing"
    return f"{found[1]} is {'' if found[2] else 'not '}planned"


def rewrite_label(rewrite: Mapping[str, Any]) -> str:
    """``"fsdp #5"``: the rewrite's strategy and 1-based number."""
    return f"{rewrite['strategy']} #{rewrite['index'] + 1}"


def _states(steps: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]] | None:
    """The model's facts after each step, from ``state`` or walked from ``gives`` / ``ends``."""
    if any("state" in s for s in steps):
        return [tuple(s.get("state") or ()) for s in steps]
    if not any(s.get("gives") or s.get("ends") for s in steps):
        return None
    facts: list[str] = []
    states = []
    for step in steps:
        facts = [f for f in facts if f not in step.get("ends", ())]
        facts += [f for f in step.get("gives", ()) if f not in facts]
        states.append(tuple(facts))
    return states


def _check_reasons(changes: Mapping[str, tuple[Change, ...]], order: Sequence[str],
                   checks: Sequence[Mapping[str, str]]) -> dict[str, list[str]]:
    """Each check's reason, at the end of its order the strategy touched (see PRIORITY)."""
    rank = {a: i for i, a in enumerate(PRIORITY)}
    found: dict[str, list[str]] = {}
    for check in checks:
        first, then = check.get("first"), check.get("then")
        if first not in order or then not in order:
            continue
        touched = [(rank.get(changes[n][0].action, len(PRIORITY)), -k, n)
                   for k, n in enumerate((first, then)) if changes.get(n)]
        if not touched:
            continue
        at = min(touched)[2]
        other = f"runs after {first}" if at == then else f"runs before {then}"
        found.setdefault(at, []).append(f"{other}: {check['why']}")
    return found


def page_model(plan: Mapping[str, Any], *, checks: Sequence[Mapping[str, str]] = (),
               docs: Mapping[str, str] | None = None) -> PageModel:
    """The :class:`PageModel` of a plan dict.

    Parameters
    ----------
    plan : mapping
        ``flexgraph plan --format json``'s object.
    checks : sequence of mapping, optional
        The strategy's order checks, ``{"first", "then", "why"}``: the reasons of its orders.
    docs : mapping of str to str, optional
        A line on what each step does, by name (a step's own ``doc`` field wins).

    Returns
    -------
    PageModel
    """
    docs = dict(docs or {})
    steps = plan["steps"]
    order = [s["name"] for s in steps]
    changes: dict[str, list[Change]] = {}
    rewrites, into, parts, actions = [], {}, {}, {}
    for rewrite in plan.get("rewrites", ()):
        label, skipped = rewrite_label(rewrite), _skipped_because(rewrite)
        if skipped is not None:
            rewrites.append(Change(label, "skipped", rewrite["description"], skipped))
            continue
        rewrites.append(Change(label, rewrite["kind"], rewrite["description"],
                               rewrite.get("why", "")))
        for name, action in rewrite.get("touched", {}).items():
            changes.setdefault(name, []).append(
                Change(label, action, rewrite["description"], rewrite.get("why", "")))
            actions.setdefault(name, action)
        for name, replacement in rewrite.get("consumed", {}).items():
            into[name] = replacement
            action = {"prune": "pruned", "fuse": "fused", "replace": "replaced"}.get(
                rewrite["kind"], "removed")
            changes.setdefault(name, []).append(Change(label, action, rewrite["description"],
                                                       rewrite.get("why", "")))
            if action == "fused" and replacement:
                parts.setdefault(replacement, []).append(name)
    frozen = {n: tuple(c) for n, c in changes.items()}
    reasons = _check_reasons(frozen, order, checks)
    states = _states(steps)
    by_name = {s["name"]: s for s in steps}
    moved = {n for n in order if any(c.action == "moved" for c in frozen.get(n, ()))}
    base_at = {n: i for i, n in enumerate(plan["base_order"], 1)}
    planned_at = {n: i for i, n in enumerate(order, 1)}
    facts_of = dict(zip(order, states or [()] * len(order), strict=True))

    def planned_box(name: str) -> Box:
        step = by_name[name]
        at = order.index(name)
        facts = facts_of[name]
        before = facts_of[order[at - 1]] if at else ()
        action = "user" if _action_of(step.get("origin")) == "user" else actions.get(
            name, "base")
        return Box(name, planned_at[name], action, step.get("doc") or docs.get(name, ""),
                   tuple(parts.get(name, ())), facts,
                   tuple(f for f in facts if f not in before),
                   tuple(f for f in before if f not in facts), tuple(step.get("needs") or ()))

    def base_box(name: str) -> Box:
        gone = next((c.action for c in frozen.get(name, ()) if c.action in (
            "removed", "pruned", "fused", "replaced")), None) if name not in planned_at else None
        action = "moved" if name in moved else gone or "base"
        return Box(name, base_at[name], action, docs.get(name, ""))

    rows = tuple(
        (base_box(r.base) if r.base else None, planned_box(r.planned) if r.planned else None)
        for r in aligned_rows(plan["base_order"], order, into, moved))
    edges = tuple(
        Edge(e["source"], e["target"], e["reason"], passed_artifacts(
            [*by_name[e["source"]]["provides"], *by_name[e["source"]]["updates"]],
            [*by_name[e["target"]]["requires"], *by_name[e["target"]]["updates"]],
            e["reason"]))
        for e in plan.get("edges", ()))
    return PageModel(plan.get("strategy"), rows, frozen,
                     {n: tuple(r) for n, r in reasons.items()}, tuple(rewrites), edges,
                     {p: n for n, ps in parts.items() for p in ps}, states is not None)

