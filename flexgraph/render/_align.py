"""The base order and the planned order, aligned by step: the rows of ``--diff`` and the page.

A base step shares a row with the step that took its place (a fuse, a replace);
a moved step gets a row at its old place and one at its new, so a view can draw the move.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from difflib import SequenceMatcher

import attrs


@attrs.frozen
class Row:
    """One row: a base step (``None``: none), a planned step (``None``: none), or both."""

    base: str | None
    planned: str | None


def partners(base_order: Sequence[str], order: Sequence[str],
             into: Mapping[str, str | None]) -> dict[str, str]:
    """Each base step with the planned step that does its work (itself, or what took it)."""
    planned = set(order)
    found = {}
    for name in base_order:
        partner = name if name in planned else into.get(name)
        if partner in planned:
            found[name] = partner
    return found


def aligned_rows(base_order: Sequence[str], order: Sequence[str],
                 into: Mapping[str, str | None], moved: Collection[str] = ()) -> list[Row]:
    pairs = partners(base_order, order, into)
    anchors, claimed = [], set()
    for name in base_order:  # a fused step is anchored by its first part only
        partner = pairs.get(name)
        if partner is not None and partner not in claimed and name not in moved \
                and partner not in moved:
            anchors.append(name)
            claimed.add(partner)
    right = [name for name in order if name in claimed]
    matcher = SequenceMatcher(None, [pairs[a] for a in anchors], right, autojunk=False)
    matched = {}
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            matched[anchors[block.a + k]] = right[block.b + k]
    base_at = {name: i for i, name in enumerate(base_order)}
    planned_at = {name: i for i, name in enumerate(order)}
    rows: list[Row] = []
    left_at, right_at = 0, 0
    for name, partner in [*matched.items(), (None, None)]:
        stop_left = base_at[name] if name is not None else len(base_order)
        stop_right = planned_at[partner] if partner is not None else len(order)
        rows += [Row(n, None) for n in base_order[left_at:stop_left]]
        rows += [Row(None, n) for n in order[right_at:stop_right]]
        if name is not None:
            rows.append(Row(name, partner))
        left_at, right_at = stop_left + 1, stop_right + 1
    return rows
