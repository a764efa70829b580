"""The plan as a table: the view ``flexgraph plan`` prints by default.

One row per step in execution order; a touched step's origin is in its
action's colour and in words, so a pipe loses nothing, and ``user`` marks the
user's steps. The caption lists each rewrite with its reason (or why it was
skipped), each step placed by its needs, and the model's state after each
step that makes or changes it. Cells are :class:`rich.text.Text`, never
markup, so a ``[`` in a name prints as itself.

Eight columns rarely fit a terminal, and rich's squeezing folds names mid-word,
so the table fits itself to its width, giving way where a reader minds least:
function references break after their ``:``, then the origin column wraps
between words, and only then does rich fold the rest.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from flexgraph.core.plan import Plan
from flexgraph.render._changes import (
    COLOURS,
    history,
    is_user,
    model_lines,
    rewrite_count,
    rewrite_lines,
)
from flexgraph.render._table_style import TABLE_STYLE

COLUMNS = ("#", "stage", "step", "fn", "requires", "provides", "updates", "origin")

ORIGIN_MIN_WIDTH = 12
"""The origin column wraps down to this width before rich squeezes the rest."""


def _names(names: tuple[str, ...]) -> Text:
    return Text("\n".join(names))


def _fn_text(ref: str, split: bool) -> Text:
    """``module:qualname``, with a line break after each ``:`` when ``split``."""
    return Text(ref.replace(":", ":\n") if split else ref, style="dim")


def origin_text(plan: Plan, name: str) -> Text:
    """``base`` (dim), ``user``, then one coloured line per origin (``"replaced by ddp #1"``).

    The rewrite itself is spelled out in the caption, on one line rather than
    folded in a column.
    """
    lines = [("user", COLOURS["user"])] if is_user(plan, name) else []
    lines += [(origin.short, COLOURS.get(origin.action, "")) for origin in history(plan, name)]
    if not lines:
        return Text("base", style=COLOURS["base"])
    text = Text()
    for i, (line, style) in enumerate(lines):
        if i:
            text.append("\n")
        text.append(line, style=style)
    return text


def plan_caption(plan: Plan) -> Text:
    """The counts line, each rewrite (``ddp #1: <rewrite>``) with its reason or why it was
    skipped, each step placed by its needs, then the model after each step that changes it."""
    text = Text(f"{len(plan.order)} steps in {len(plan.stages)} stages; {rewrite_count(plan)}")
    for applied in plan.rewrites:
        for line in rewrite_lines(applied):
            text.append(f"\n  {line}")
    for name in plan.order:
        for origin in history(plan, name):
            if origin.action == "placed":
                text.append(f"\n  {name} {origin}")
    for line in model_lines(plan):
        text.append(f"\n{line}")
    return text


def plan_title(plan: Plan) -> str:
    """``"plan: ddp"``, or ``"plan: base graph (no strategy)"``."""
    return f"plan: {plan.strategy}" if plan.strategy else "plan: base graph (no strategy)"


def _fill(table: Table, plan: Plan, split_fn: bool) -> Table:
    stage_of = {name: i for i, stage in enumerate(plan.stages, 1) for name in stage}
    for header in COLUMNS:
        table.add_column(header, justify="right" if header in ("#", "stage") else "left",
                         overflow="fold")
    table.columns[2].style = "bold"
    for position, step in enumerate(plan.steps, 1):
        table.add_row(
            Text(str(position)),
            Text(str(stage_of[step.name])),
            Text(step.name),
            _fn_text(step.fn_name, split_fn),
            _names(step.requires),
            _names(step.provides),
            _names(step.updates),
            origin_text(plan, step.name),
        )
    return table


def _table(plan: Plan, split_fn: bool) -> Table:
    table = Table(title=plan_title(plan), caption=plan_caption(plan), **TABLE_STYLE)
    return _fill(table, plan, split_fn)


def _column_width(table: Table, index: int) -> int:
    column = table.columns[index]
    lines = [str(column.header)]
    lines += [line for cell in column.cells for line in str(cell).splitlines()]
    return max(len(line) for line in lines)


COLUMN_GAP = 2
"""Spaces between two columns (padding collapsed, no edges, a blank divider)."""


def _natural_width(table: Table) -> int:
    """The table's width with no cell wrapped: cheap, from the cells' text."""
    widths = [_column_width(table, i) for i in range(len(table.columns))]
    return sum(widths) + COLUMN_GAP * (len(widths) - 1)


def fit_table(plan: Plan, width: int) -> Table:
    """The plan table laid out for ``width`` columns (see the module docstring)."""
    table = _table(plan, split_fn=False)
    if _natural_width(table) <= width:
        return table
    table = _table(plan, split_fn=True)
    excess = _natural_width(table) - width
    if excess > 0:
        origin = COLUMNS.index("origin")
        natural = _column_width(table, origin)
        table.columns[origin].max_width = max(natural - excess, min(natural, ORIGIN_MIN_WIDTH))
    return table


class PlanTable(Table):
    """The table of one plan, which fits itself to the width it is drawn at.

    Undrawn it holds the rows at their natural layout, to inspect like any table.
    """

    def __init__(self, plan: Plan) -> None:
        super().__init__(title=plan_title(plan), caption=plan_caption(plan), **TABLE_STYLE)
        self.plan = plan
        _fill(self, plan, split_fn=False)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield fit_table(self.plan, options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, fit_table(self.plan, options.max_width))


def plan_table(plan: Plan) -> Table:
    """``plan`` as a table, one row per step in execution order (see the module docstring).

    Titled with the strategy; the caption counts steps, stages and rewrites and
    lists the rewrites the origins refer to.
    """
    return PlanTable(plan)
