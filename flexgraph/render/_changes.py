"""What a strategy did to each step, answered once, so the table, diff, explain, dot and
Mermaid views agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from flexgraph.core.graph import Edge
from flexgraph.core.plan import AppliedRewrite, Origin, Plan
from flexgraph.core.step import MODEL

ACTIONS = ("inserted", "moved", "replaced", "fused", "configured", "removed", "placed", "user")
"""Every action a rewrite reports, in the order legends list them; ``placed``: a
user's step placed by its needs; ``user``: a step the user added."""

MARKERS: Mapping[str, str] = {
    "base": " ",
    "inserted": "+",
    "removed": "-",
    "moved": "~",
    "replaced": "!",
    "fused": "&",
    "configured": "*",
    "placed": ">",
    "user": "u",
}
"""One-character marker per action, so plain text (no colour) still shows it."""

COLOURS: Mapping[str, str] = {
    "base": "dim",
    "inserted": "green",
    "removed": "red",
    "moved": "yellow",
    "replaced": "magenta",
    "fused": "cyan",
    "configured": "blue",
    "placed": "bright_yellow",
    "user": "bold",
}
"""Rich style per action (terminal views only; pipes get the markers)."""


def rewrite_label(applied: AppliedRewrite) -> str:
    """``"ddp #1"``: the strategy and 1-based number of an applied rewrite."""
    return f"{applied.strategy} #{applied.index + 1}"


def rewrite_lines(applied: AppliedRewrite) -> list[str]:
    """``ddp #1: <rewrite>``, then ``skipped: ...`` or its ``why: ...``."""
    lines = [f"{rewrite_label(applied)}: {applied.description}"]
    if applied.skipped is not None:
        lines.append(f"  skipped: {applied.skipped}")
    elif applied.why:
        lines.append(f"  why: {applied.why}")
    return lines


def rewrite_count(plan: Plan) -> str:
    """``"10 rewrites applied"``, or ``"10 rewrites: 7 applied, 3 skipped"``."""
    skipped = sum(1 for r in plan.rewrites if not r.applied)
    if not skipped:
        return f"{len(plan.rewrites)} rewrites applied"
    return (f"{len(plan.rewrites)} rewrites: {len(plan.rewrites) - skipped} applied, "
            f"{skipped} skipped")


def history(plan: Plan, name: str) -> tuple[Origin, ...]:
    return tuple(plan.history.get(name, ()))


def is_user(plan: Plan, name: str) -> bool:
    return bool(plan.graph.by_name[name].user)


def first_action(plan: Plan, name: str) -> str:
    """The action that put ``name`` where it is (an insert then configure is inserted)."""
    entries = history(plan, name)
    if entries:
        return entries[0].action
    return "user" if is_user(plan, name) else "base"


def model_words(plan: Plan, name: str) -> tuple[str, ...]:
    """The model's facts after step ``name``, when it makes or changes the model (else ``()``)."""
    step = plan.graph.by_name[name]
    if MODEL not in step.provides + step.updates:
        return ()
    return plan.states.get(name) or ()


def model_lines(plan: Plan) -> list[str]:
    """``the model after each step that changes it:`` and a line per such step, or ``[]``."""
    states = [(name, model_words(plan, name)) for name in plan.order]
    states = [(name, words) for name, words in states if words]
    if not states:
        return []
    width = max(len(name) for name, _ in states)
    return ["the model after each step that changes it:"] + [
        f"  {name:<{width}}  {', '.join(words)}" for name, words in states]


@attrs.frozen
class Gone:
    """A base step the plan no longer has, the rewrite that took it, and its replacement."""

    name: str
    action: str
    rewrite: AppliedRewrite
    into: str | None = None

    def __str__(self) -> str:
        if self.rewrite.index < 0:
            return f"{self.action} by a rewrite the plan does not name"
        return f"{self.action} by {rewrite_label(self.rewrite)}: {self.rewrite.description}"


_ACTION_OF_KIND = {"remove": "removed", "prune": "removed", "replace": "replaced",
                   "fuse": "fused"}
"""A pruned step is shown as removed; its reason is in the rewrite's text."""


def _consumed(applied: AppliedRewrite) -> list[tuple[str, str, str | None]]:
    """``(name, action, into)`` for each step ``applied`` took out of the graph."""
    action = _ACTION_OF_KIND.get(applied.kind, "removed")
    return [(name, action, into) for name, into in applied.consumed.items()]


def gone_steps(plan: Plan) -> dict[str, Gone]:
    """Base steps missing from the plan, in base order, each with the last rewrite that took it."""
    taken: dict[str, Gone] = {}
    for applied in plan.rewrites:
        for name, action, into in _consumed(applied):
            taken[name] = Gone(name, action, applied, into)
    return {
        name: taken.get(name, Gone(name, "removed", _UNKNOWN))
        for name in plan.base_order
        if name not in plan.graph
    }


_UNKNOWN = AppliedRewrite(index=-1, strategy="?", description="?", kind="?", touched={})
"""Stands in when no rewrite's record names a missing base step."""


def edge_artifacts(plan: Plan, edge: Edge) -> tuple[str, ...]:
    """The artifacts an edge passes, read from its reason, only those its source writes."""
    source = plan.graph.by_name[edge.source]
    target = plan.graph.by_name[edge.target]
    return passed_artifacts(source.outputs, target.inputs, edge.reason)


def passed_artifacts(outputs: Sequence[str], inputs: Sequence[str],
                     reason: str) -> tuple[str, ...]:
    """The ``outputs`` of an edge's source that its target reads, as its ``reason`` says."""
    return tuple(
        artifact
        for artifact in outputs
        if artifact in inputs
        and re.search(rf"\b(?:requires|updates) {re.escape(artifact)}(?:,|;| |$)", reason)
    )


def ordered_edges(plan: Plan) -> list[Edge]:
    """The plan's derived edges sorted by the positions of source, then target."""
    position = {name: i for i, name in enumerate(plan.order)}
    return sorted(plan.edges, key=lambda e: (position[e.source], position[e.target]))


def pruned_steps(plan: Plan) -> dict[str, str]:
    """Steps a derived rewrite pruned, by name, each with its reason."""
    found = {}
    for applied in plan.rewrites:
        if applied.kind != "prune":
            continue
        for name in applied.consumed:
            found[name] = applied.description.removeprefix(f"prune {name} (").removesuffix(")")
    return found


def derivation_lines(derived: Mapping[str, Mapping[str, str]]) -> list[str]:
    """What a run's files changed in its plan, as lines for the log and ``--estimate``."""
    return ([f"pruned: {step} ({reason})" for step, reason in derived.get("pruned", {}).items()]
            + [f"{step}: {note}" for step, note in derived.get("notes", {}).items()])
