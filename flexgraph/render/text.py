"""The plan as a table: the view ``flexgraph plan`` prints by default.

One row per step in execution order, with the stage it belongs to, its function
and its declared artifacts, and where it came from. Steps the strategy touched
carry their origin in the colour of the action (and in words, so a pipe without
colour loses nothing); base steps say ``base``, dimmed. Every cell is a
:class:`rich.text.Text`, never markup, so a ``[`` in a name prints as itself.

Eight columns rarely fit a terminal at their natural width, and rich's own
squeezing folds names mid-word. So the table fits itself to the width it is
drawn at, giving way in the order a reader minds least: function references
break after their ``:``, then the origin column wraps between words, and only
then does rich fold what is left. Artifacts are listed one per line, which
keeps their columns as narrow as their longest name.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from flexgraph.core.plan import Plan
from flexgraph.render._changes import COLOURS, history, rewrite_label
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
    """Where ``name`` came from: ``base`` (dim) or one coloured line per rewrite.

    Parameters
    ----------
    plan : Plan
    name : str
        A step of the plan.

    Returns
    -------
    rich.text.Text
        ``"base"``, or for each :class:`~flexgraph.core.plan.Origin` of the
        step's history, oldest first, the start of its text up to the rewrite's
        number (``"replaced by ddp #1"``); the rewrite itself is spelled out in
        the table's caption, where it takes one line instead of a folded column.
    """
    entries = history(plan, name)
    if not entries:
        return Text("base", style=COLOURS["base"])
    text = Text()
    for i, origin in enumerate(entries):
        if i:
            text.append("\n")
        short = f"{origin.action} by {origin.strategy} #{(origin.index or 0) + 1}"
        text.append(short, style=COLOURS.get(origin.action, ""))
    return text


def plan_caption(plan: Plan) -> Text:
    """The counts line, then one ``ddp #1: <rewrite>`` line per applied rewrite."""
    text = Text(
        f"{len(plan.order)} steps in {len(plan.stages)} stages; "
        f"{len(plan.rewrites)} rewrites applied"
    )
    for applied in plan.rewrites:
        text.append(f"\n  {rewrite_label(applied)}: {applied.description}")
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
    """The plan table laid out for ``width`` columns (see the module docstring).

    Parameters
    ----------
    plan : Plan
    width : int
        The width the table is about to be drawn at.

    Returns
    -------
    rich.table.Table
    """
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
    """The table of one plan; drawn, it fits itself to the width (see :func:`fit_table`).

    As a :class:`~rich.table.Table` it holds the plan's rows at their natural
    layout, so its columns and cells can be inspected like any table's.
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
    """Render ``plan`` as a table, one row per step in execution order.

    Parameters
    ----------
    plan : Plan
        A plan from :func:`flexgraph.make_plan` or a spec.

    Returns
    -------
    rich.table.Table
        Columns ``#``, ``stage`` (both 1-based), ``step``, ``fn``, ``requires``,
        ``provides``, ``updates``, ``origin``; titled with the strategy, with a
        caption counting steps, stages and rewrites and listing the rewrites the
        origins refer to. It fits itself to the console it is printed on (see
        the module docstring); the same plan at the same width always gives the
        same text.
    """
    return PlanTable(plan)
