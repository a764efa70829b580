"""The plan next to the base graph, row by row (``flexgraph plan CONFIG --diff``).

Left the base order, right the planned order, one row per position; each step
marked with what the strategy did to it (or ``u``, the user's), in colour on a
terminal and by the one-character markers of the legend in a pipe. The
rewrites follow, each with its reason or why it was skipped, then the model's
state after each step that changes it.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from flexgraph.core.plan import Plan
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
from flexgraph.render._table_style import TABLE_STYLE


def _base_cell(name: str, gone: Gone | None) -> Text:
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


def _change_cell(plan: Plan, name: str | None, gone: Gone | None) -> Text:
    text = Text()
    lines: list[tuple[str, str]] = []
    if name is not None:
        lines += [(str(o), COLOURS.get(o.action, "")) for o in history(plan, name)]
    if gone is not None and all(o.index != gone.rewrite.index for o in history(plan, name or "")):
        lines.append((f"{gone.name} {gone}", COLOURS["removed"]))
    for i, (line, style) in enumerate(lines):
        if i:
            text.append("\n")
        text.append(line, style=style)
    return text


def legend() -> Text:
    """The marker legend: ``+ inserted   - removed   ~ moved ...``."""
    text = Text()
    for i, action in enumerate(ACTIONS):
        if i:
            text.append("   ")
        text.append(f"{MARKERS[action]} {action}", style=COLOURS[action])
    return text


def rewrite_list(plan: Plan) -> Text:
    """The rewrites, one numbered line each (``  ddp #1: replace ...``), with their reasons."""
    if not plan.rewrites:
        return Text("no rewrites applied: the plan is the base graph's order")
    counted = rewrite_count(plan)
    if counted.endswith("applied"):
        text = Text(f"rewrites applied by {plan.strategy}:")
    else:
        text = Text(f"rewrites of {plan.strategy} ({counted.partition(': ')[2]}):")
    for applied in plan.rewrites:
        for line in rewrite_lines(applied):
            text.append(f"\n  {line}")
    return text


def plan_diff(plan: Plan) -> RenderableType:
    """The base order and the planned order side by side, the legend, then the rewrites."""
    gone = gone_steps(plan)
    table = Table(title=f"plan diff: base graph -> {plan.strategy or 'no strategy'}",
                  **TABLE_STYLE)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("base", overflow="fold")
    table.add_column("plan", overflow="fold")
    table.add_column("change", overflow="fold")
    for position in range(max(len(plan.base_order), len(plan.order))):
        base = plan.base_order[position] if position < len(plan.base_order) else None
        planned = plan.order[position] if position < len(plan.order) else None
        taken = gone.get(base) if base is not None else None
        table.add_row(
            Text(str(position + 1)),
            _base_cell(base, taken) if base is not None else Text(""),
            _planned_cell(plan, planned) if planned is not None else Text(""),
            _change_cell(plan, planned, taken),
        )
    model = [Text(""), Text("\n".join(model_lines(plan)))] if model_lines(plan) else []
    return Group(table, legend(), Text(""), rewrite_list(plan), *model)
