"""The plan next to the base graph, step by step (``flexgraph plan CONFIG --diff``).

Each step is marked with what the strategy did to it, in colour on a terminal
and by the legend's one-character markers in a pipe.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.text import Text

from flexgraph.core.plan import Plan
from flexgraph.render._align import aligned_rows
from flexgraph.render._changes import (
    ACTIONS,
    COLOURS,
    MARKERS,
    Gone,
    first_action,
    gone_steps,
    history,
    model_lines,
    rewrite_count,
    rewrite_lines,
)
from flexgraph.render._wrap import fitted_table, styled
from flexgraph.render.text import hanging


def _base_cell(name: str, gone: Gone | None, moved_to: int | None, action: str) -> Text:
    if moved_to is not None:
        return Text(f"{MARKERS[action]} {name} -> {moved_to}", style=COLOURS[action])
    if gone is None:
        return Text(f"  {name}")
    text = Text(f"{MARKERS['removed']} ")
    text.append(name, style=f"{COLOURS['removed']} strike")
    if gone.into:
        text.append(f" -> {gone.into}", style=COLOURS[gone.action])
    return text


def _planned_cell(plan: Plan, name: str) -> Text:
    action = first_action(plan, name)
    return Text(f"{MARKERS[action]} {name}", style="" if action == "base" else COLOURS[action])


def _change_cell(plan: Plan, name: str | None, gone: Gone | None,
                 moved_from: int | None) -> Text:
    lines: list[tuple[str, str]] = []
    if name is not None:
        lines += [(str(o), COLOURS.get(o.action, "")) for o in history(plan, name)]
        if moved_from is not None:
            lines.append((f"(base position {moved_from})", COLOURS[first_action(plan, name)]))
    if gone is not None and all(o.index != gone.rewrite.index for o in history(plan, name or "")):
        lines.append((f"{gone.name} {gone}", COLOURS["removed"]))
    return styled(lines)


def legend() -> Text:
    """The marker legend: ``+ inserted   - removed   ~ moved ...``."""
    text = Text()
    for i, action in enumerate(ACTIONS):
        if i:
            text.append("   ")
        text.append(f"{MARKERS[action]} {action}", style=COLOURS[action])
    return text


def rewrite_list(plan: Plan, width: int = 120) -> Text:
    """The rewrites, one numbered line each, with their reasons, wrapped."""
    if not plan.rewrites:
        return Text("no rewrites applied: the plan is the base graph's order")
    counted = rewrite_count(plan)
    if counted.endswith("applied"):
        lines = [Text(f"rewrites applied by {plan.strategy}:")]
    else:
        lines = [Text(f"rewrites of {plan.strategy} ({counted.partition(': ')[2]}):")]
    lines += [hanging(Text(f"  {line}"), width)
              for applied in plan.rewrites for line in rewrite_lines(applied)]
    return Text("\n").join(lines)


def plan_diff(plan: Plan, width: int | None = None) -> RenderableType:
    """The base order and the planned order side by side, the legend, then the rewrites."""
    return PlanDiff(plan, width)


def _rows(plan: Plan) -> list[list[Text]]:
    gone = gone_steps(plan)
    moved = {n for n in plan.order
             if any(o.action in ("moved", "placed") for o in history(plan, n))}
    base_at = {name: i for i, name in enumerate(plan.base_order, 1)}
    planned_at = {name: i for i, name in enumerate(plan.order, 1)}
    rows = []
    for row in aligned_rows(plan.base_order, plan.order,
                            {n: g.into for n, g in gone.items()}, moved):
        base, planned = row.base, row.planned
        moved_to = planned_at[base] if base in moved and planned is None else None
        moved_from = base_at.get(planned) if planned in moved and base is None else None
        rows.append([
            Text(str(base_at[base]) if base else ""),
            _base_cell(base, gone.get(base), moved_to,
                       first_action(plan, base) if moved_to else "moved") if base else Text(""),
            Text(str(planned_at[planned]) if planned else ""),
            _planned_cell(plan, planned) if planned else Text(""),
            _change_cell(plan, planned, gone.get(base) if base else None, moved_from),
        ])
    return rows


class PlanDiff:
    """:func:`plan_diff`'s renderable: fits the table to the width it is drawn at."""

    def __init__(self, plan: Plan, width: int | None) -> None:
        self.plan, self.width = plan, width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = self.width or options.max_width
        title = f"plan diff: base graph -> {self.plan.strategy or 'no strategy'}"
        table = fitted_table(("#", "base", "#", "plan", "change"), _rows(self.plan), width,
                             shrink_first=(4,), right=(0, 2), title=title)
        model = [hanging(Text(line), width) for line in model_lines(self.plan)]
        yield Group(table, legend(), Text(""), rewrite_list(self.plan, width),
                    *([Text(""), *model] if model else []))
