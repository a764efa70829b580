"""What a strategy did to each step, in the form every view needs.

The views (table, diff, dot, mermaid) all answer the same questions: which
action placed or changed a step, how to mark it, and why a base step is no
longer in the plan. Answering them once here keeps the views consistent: the
same step is called "fused" with the same marker and colour everywhere.

A plan records what each rewrite did to the steps it *produced*; a step that a
``Replace`` or ``Fuse`` consumed under another name is not in the final graph,
so :func:`gone_steps` recovers it from the rewrite's one-line description, whose
form the rewrites in :mod:`flexgraph.core.rewrite` fix (step names are
identifiers, so the parse is exact).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from flexgraph.core.graph import Edge
from flexgraph.core.plan import AppliedRewrite, Origin, Plan

ACTIONS = ("inserted", "moved", "replaced", "fused", "configured", "removed")
"""Every action a rewrite reports, in the order legends list them."""

MARKERS: Mapping[str, str] = {
    "base": " ",
    "inserted": "+",
    "removed": "-",
    "moved": "~",
    "replaced": "!",
    "fused": "&",
    "configured": "*",
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
}
"""Rich style per action (terminal views only; pipes get the markers)."""


def rewrite_label(applied: AppliedRewrite) -> str:
    """``"ddp #1"``: the strategy and 1-based number of an applied rewrite."""
    return f"{applied.strategy} #{applied.index + 1}"


def history(plan: Plan, name: str) -> tuple[Origin, ...]:
    """Every rewrite that placed or changed ``name``, oldest first (empty for base)."""
    return tuple(plan.history.get(name, ()))


def first_action(plan: Plan, name: str) -> str:
    """The action that put ``name`` where it is: its first rewrite's, or ``"base"``.

    A step inserted and later configured is marked as inserted: where it came
    from matters more than that it was configured afterwards.
    """
    entries = history(plan, name)
    return entries[0].action if entries else "base"


@attrs.frozen
class Gone:
    """A base step the plan no longer has, and the rewrite that took it out.

    ``action`` is ``"removed"``, ``"replaced"`` or ``"fused"``; ``into`` names
    the step that took its place (``None`` for a removal).
    """

    name: str
    action: str
    rewrite: AppliedRewrite
    into: str | None = None

    def __str__(self) -> str:
        """``"removed by ddp #2: remove resume"``, the form of an Origin's text."""
        if self.rewrite.index < 0:
            return f"{self.action} by a rewrite the plan does not name"
        return f"{self.action} by {rewrite_label(self.rewrite)}: {self.rewrite.description}"


_ACTION_OF_KIND = {"remove": "removed", "prune": "removed", "replace": "replaced",
                   "fuse": "fused"}
"""A pruned step (a derived rewrite) is shown as removed, its reason in the rewrite's text."""


def _consumed(applied: AppliedRewrite) -> list[tuple[str, str, str | None]]:
    """``(name, action, into)`` for each step ``applied`` took out of the graph."""
    action = _ACTION_OF_KIND.get(applied.kind, "removed")
    return [(name, action, into) for name, into in applied.consumed.items()]


def gone_steps(plan: Plan) -> dict[str, Gone]:
    """Base steps missing from the plan, by name, with the rewrite that took each.

    Returns
    -------
    dict
        Name -> :class:`Gone`, in base order. The last rewrite that took a step
        out wins (a step removed, re-inserted and removed again names the last).
    """
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
"""Stands in when no rewrite's record names a missing base step (a future kind)."""


def edge_artifacts(plan: Plan, edge: Edge) -> tuple[str, ...]:
    """The artifacts an edge's reason names (empty for a pure ordering edge).

    An edge carries an artifact when its source writes it (provides or updates)
    and its reason says the target requires or updates it; reasons of merged
    edges are joined with ``"; "``, so one edge may carry several. The source
    writing the artifact is checked too, so a name in a reason is never mistaken.
    """
    source = plan.graph.by_name[edge.source]
    target = plan.graph.by_name[edge.target]
    return tuple(
        artifact
        for artifact in source.outputs
        if artifact in target.inputs
        and re.search(rf"\b(?:requires|updates) {re.escape(artifact)}(?:,|;| |$)", edge.reason)
    )


def ordered_edges(plan: Plan) -> list[Edge]:
    """The plan's derived edges sorted by the positions of source, then target."""
    position = {name: i for i, name in enumerate(plan.order)}
    return sorted(plan.edges, key=lambda e: (position[e.source], position[e.target]))


def pruned_steps(plan: Plan) -> dict[str, str]:
    """Steps a derived rewrite pruned, by name, each with its reason (``Prune``).

    The reason is the text in parentheses that ends the rewrite's description
    (``prune init_weights (every state_dict entry comes from load_from 'x.pth')``).
    """
    found = {}
    for applied in plan.rewrites:
        if applied.kind != "prune":
            continue
        for name in applied.consumed:
            found[name] = applied.description.removeprefix(f"prune {name} (").removesuffix(")")
    return found


def derivation_lines(derived: Mapping[str, Mapping[str, str]]) -> list[str]:
    """What a run's files changed in its plan, as the log and ``--estimate`` print it.

    Parameters
    ----------
    derived : mapping
        ``{"pruned": {step: reason}, "notes": {step: line}}`` (either part may
        be absent), as :func:`flexgraph.cli.planning.derived_plan` returns it.

    Returns
    -------
    list of str
        ``pruned: init_weights (every state_dict entry comes from load_from 'x.pth')``
        per pruned step, then ``step: note`` per note.
    """
    return ([f"pruned: {step} ({reason})" for step, reason in derived.get("pruned", {}).items()]
            + [f"{step}: {note}" for step, note in derived.get("notes", {}).items()])
