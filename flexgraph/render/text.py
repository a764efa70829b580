"""The plan as a table: the view ``flexgraph plan`` prints by default.

A touched step's origin is in colour and in words, so a pipe loses nothing.
Cells are :class:`rich.text.Text`, never markup, so a ``[`` in a name prints as itself.
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
from flexgraph.render._wrap import fitted_table, styled, table_width, wrap

COLUMNS = ("#", "stage", "step", "fn", "requires", "provides", "updates", "origin")


def _names(names: tuple[str, ...]) -> Text:
    return Text("\n".join(names))


def origin_text(plan: Plan, name: str) -> Text:
    """``base`` (dim), ``user``, then one coloured line per origin (``"replaced by ddp #1"``)."""
    lines = [("user", COLOURS["user"])] if is_user(plan, name) else []
    lines += [(origin.short, COLOURS.get(origin.action, "")) for origin in history(plan, name)]
    if not lines:
        return Text("base", style=COLOURS["base"])
    return styled(lines)


STAGE_NOTE = ("stage: 1 + the longest chain of steps the step waits for; steps of one stage "
              "need nothing from each other")
"""What the ``stage`` column means, said under every table that has it."""


def plan_caption(plan: Plan, width: int | None = None) -> Text:
    """The counts, stage note, rewrites, placements and model lines, wrapped to ``width``."""
    lines = [f"{len(plan.order)} steps in {len(plan.stages)} stages; {rewrite_count(plan)}",
             STAGE_NOTE]
    lines += [f"  {line}" for applied in plan.rewrites for line in rewrite_lines(applied)]
    lines += [f"  {name} {origin}" for name in plan.order for origin in history(plan, name)
              if origin.action == "placed"]
    lines += model_lines(plan)
    if width is None:
        return Text("\n".join(lines))
    return Text("\n").join(hanging(Text(line), width) for line in lines)


def hanging(line: Text, width: int) -> Text:
    """``line`` wrapped to ``width``, its continuation lines indented four spaces past it."""
    indent = len(line.plain) - len(line.plain.lstrip(" ")) + 4
    first = wrap(line, width).split("\n")[0]
    rest = line[len(first.plain):]
    rest = rest[len(rest.plain) - len(rest.plain.lstrip(" ")):]
    if not rest.plain:
        return first
    return Text("\n").join([first, *(Text(" " * indent) + r
                                     for r in wrap(rest, width - indent).split("\n"))])


def plan_title(plan: Plan) -> str:
    """``"plan: ddp"``, or ``"plan: base graph (no strategy)"``."""
    return f"plan: {plan.strategy}" if plan.strategy else "plan: base graph (no strategy)"


def _cells(plan: Plan) -> list[list[Text]]:
    stage_of = {name: i for i, stage in enumerate(plan.stages, 1) for name in stage}
    return [[Text(str(position)), Text(str(stage_of[step.name])), Text(step.name, style="bold"),
             Text(step.fn_name, style="dim"), _names(step.requires), _names(step.provides),
             _names(step.updates), origin_text(plan, step.name)]
            for position, step in enumerate(plan.steps, 1)]


SHRINK_FIRST = (COLUMNS.index("fn"), COLUMNS.index("origin"))
"""The columns that give way first: references break after a dot or a colon, origins wrap."""

LEFT_OUT_FIRST = ("fn", "stage")
"""Left out, in this order, where the table cannot fit without breaking an identifier."""


def fit_table(plan: Plan, width: int) -> Table:
    rows = _cells(plan)
    kept = list(COLUMNS)
    for left_out in ("", *LEFT_OUT_FIRST):
        if left_out:
            kept.remove(left_out)
        keep = [COLUMNS.index(c) for c in kept]
        table = fitted_table(kept, [[row[i] for i in keep] for row in rows], width,
                             shrink_first=[keep.index(i) for i in SHRINK_FIRST if i in keep],
                             right=(0, 1) if "stage" in kept else (0,), title=plan_title(plan))
        if table_width(table) <= width:
            break
    caption = plan_caption(plan, width)
    gone = [c for c in COLUMNS if c not in kept]
    if gone:
        caption.append(f"\n{' and '.join(gone)} left out to fit {width} columns "
                       f"(--explain STEP shows a step whole)")
    table.caption = caption
    return table


class PlanTable(Table):
    """The table of one plan, which fits itself to the width it is drawn at."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(title=plan_title(plan), caption=plan_caption(plan), **TABLE_STYLE)
        self.plan = plan
        for header in COLUMNS:
            self.add_column(header, justify="right" if header in ("#", "stage") else "left")
        for row in _cells(plan):
            self.add_row(*row)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = fit_table(self.plan, options.max_width)  # wider only where a name is
        yield from console.render(table, options.update_width(
            max(options.max_width, table_width(table))))

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        table = fit_table(self.plan, options.max_width)
        return Measurement.get(console, options.update_width(
            max(options.max_width, table_width(table))), table)


def plan_table(plan: Plan) -> Table:
    """``plan`` as a table, one row per step in execution order."""
    return PlanTable(plan)
