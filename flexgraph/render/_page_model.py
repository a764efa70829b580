"""What the plan page draws, read from the plan's JSON dict (``flexgraph.plan/1`` or ``/2``).

Drawn from the dict, not the :class:`~flexgraph.Plan`, so a run's recorded
``plan.json`` draws the same; what ``/2`` adds is skipped where absent.
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
    held: str = ""
    """A conditional rewrite that applied: its condition (``"init_weights is planned"``)."""


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
    user: bool = False


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


def _placed(step: Mapping[str, Any]) -> str | None:
    """Where and why the plan placed a user's step by its needs (``None``: it did not)."""
    origin = step.get("origin")
    if isinstance(origin, Mapping) and origin.get("action") == "placed":
        return str(origin.get("rewrite") or "")
    return None


_CONDITION = re.compile(r", when (\w+) is (not )?planned$")


def _condition(rewrite: Mapping[str, Any], held: bool) -> str:
    """A conditional rewrite's condition as it stood (``""``: not a conditional one)."""
    found = _CONDITION.search(rewrite["description"])
    if found is None:
        return ""
    planned = (found[2] is None) == held  # IfPresent held, or IfAbsent skipped
    return f"{found[1]} is {'' if planned else 'not '}planned"


def _skipped_because(rewrite: Mapping[str, Any]) -> str | None:
    """Why a rewrite changed nothing (``None``: it did change something)."""
    if rewrite.get("skipped"):
        return str(rewrite["skipped"])
    if rewrite.get("touched") or rewrite.get("consumed") or rewrite.get("applied") is True:
        return None
    return _condition(rewrite, held=False) or "it changed nothing"


def rewrite_label(rewrite: Mapping[str, Any]) -> str:
    """``"fsdp #5"``: the rewrite's strategy and 1-based number."""
    return f"{rewrite['strategy']} #{rewrite['index'] + 1}"


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
                               rewrite.get("why", ""), _condition(rewrite, held=True)))
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
    for step in steps:
        placed = _placed(step)
        if placed is not None:
            changes.setdefault(step["name"], []).append(Change("", "placed", placed))
    frozen = {n: tuple(c) for n, c in changes.items()}
    reasons = _check_reasons(frozen, order, checks)
    by_name = {s["name"]: s for s in steps}
    moved = {n for n in order
             if any(c.action in ("moved", "placed") for c in frozen.get(n, ()))}
    base_at = {n: i for i, n in enumerate(plan["base_order"], 1)}
    planned_at = {n: i for i, n in enumerate(order, 1)}
    facts_of = {s["name"]: tuple(s.get("state") or ()) for s in steps}

    def planned_box(name: str) -> Box:
        step = by_name[name]
        at = order.index(name)
        facts = facts_of[name]
        before = facts_of[order[at - 1]] if at else ()
        user = bool(step.get("user")) or step.get("origin") == "user"
        action = ("placed" if _placed(step) is not None else "user" if user
                  else actions.get(name, "base"))
        return Box(name, planned_at[name], action, step.get("doc") or docs.get(name, ""),
                   tuple(parts.get(name, ())), facts,
                   tuple(f for f in facts if f not in before),
                   tuple(f for f in before if f not in facts),
                   tuple(step.get("needs") or step.get("implied_needs") or ()), user)

    def base_box(name: str) -> Box:
        if name in moved:
            action = "placed" if _placed(by_name[name]) is not None else "moved"
        elif name in planned_at:
            action = "base"
        else:
            action = next((c.action for c in frozen.get(name, ()) if c.action in (
                "removed", "pruned", "fused", "replaced")), "base")
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
                     {p: n for n, ps in parts.items() for p in ps}, any(facts_of.values()))

