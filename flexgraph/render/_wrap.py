"""Tables that fit a width without breaking an identifier.

A line breaks at a space or after a character that cannot be part of an
identifier, never between two word characters; cells are wrapped here, so rich never folds one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from flexgraph.render._table_style import TABLE_STYLE

_PIECE = re.compile(r"[(\[{'\"#]*\w+[^\w\s(\[{]*\s*|[^\w\s]+\s*|\s+")
"""A word, the brackets and quotes that open it, the punctuation after it, then its spaces.

A line may break after each piece."""

COLUMN_GAP = 2
"""Spaces between two columns (padding collapsed, no edges, a blank divider)."""


def _pieces(line: str) -> list[str]:
    return _PIECE.findall(line)


def min_width(text: str) -> int:
    """The longest piece of ``text`` a line cannot break (at least 1)."""
    return max((len(p.rstrip()) for line in text.splitlines() for p in _pieces(line)),
               default=0) or 1


def natural_width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def _breaks(line: str, width: int) -> list[int]:
    """Offsets where ``line``'s wrapped lines start: greedy, or at the last space past half."""
    starts: list[int] = []
    start = at = 0
    space = None
    for piece in _pieces(line):
        if at + len(piece.rstrip()) - start > width and at > start:
            start = space if space is not None and space - start > width // 2 else at
            starts.append(start)
            space = None
        at += len(piece)
        if piece[-1].isspace():
            space = at
    return starts


def wrap(text: Text, width: int) -> Text:
    """``text`` with its lines broken to ``width`` columns where a break is allowed."""
    out = []
    for line in text.split("\n"):
        parts = list(line.divide(_breaks(line.plain, width))) if line.plain else [line]
        for part in parts:
            part.rstrip()  # in place
        out += parts
    return Text("\n").join(out)


def fit_widths(natural: Sequence[int], minimum: Sequence[int], width: int,
               shrink_first: Sequence[int]) -> list[int]:
    """Column widths fitting ``width`` where minimums allow; ``shrink_first`` give way first."""
    widths = list(natural)
    excess = sum(widths) + COLUMN_GAP * (len(widths) - 1) - width
    others = sorted(set(range(len(widths))) - set(shrink_first), key=lambda i: -widths[i])
    for i in [*shrink_first, *others]:
        if excess <= 0:
            break
        give = min(excess, widths[i] - minimum[i])
        widths[i] -= give
        excess -= give
    return widths


def fitted_table(headers: Sequence[str], rows: Sequence[Sequence[Text]], width: int, *,
                 shrink_first: Sequence[int] = (), right: Sequence[int] = (),
                 **table: Any) -> Table:
    """A table of ``rows`` fitted to ``width``; ``right``: the right-justified columns."""
    columns = [[Text(h), *(row[i] for row in rows)] for i, h in enumerate(headers)]
    natural = [max(natural_width(c.plain) for c in cells) for cells in columns]
    minimum = [max(min_width(c.plain) for c in cells) for cells in columns]
    widths = fit_widths(natural, minimum, width, shrink_first)
    out = Table(**{**TABLE_STYLE, **table})
    for i, header in enumerate(headers):
        out.add_column(wrap(Text(header), widths[i]), width=widths[i], no_wrap=True,
                       justify="right" if i in right else "left")
    for row in rows:
        out.add_row(*(wrap(cell, widths[i]) for i, cell in enumerate(row)))
    return out


def table_width(table: Table) -> int:
    return sum(c.width or 0 for c in table.columns) + COLUMN_GAP * (len(table.columns) - 1)


def styled(pairs: Sequence[tuple[str, str]] | Mapping[str, str]) -> Text:
    """Lines of text, each in its own style: ``[(line, style), ...]``."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return Text("\n").join(Text(line, style=style) for line, style in items)
