"""Two plans side by side: the one that saved a checkpoint and the one resuming it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from flexgraph.render._changes import COLOURS, MARKERS
from flexgraph.render._table_style import TABLE_STYLE


def _steps(plan: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {step["name"]: step for step in plan.get("steps", [])}


def _order(plan: Mapping[str, Any]) -> list[str]:
    return [name for stage in plan.get("stages", []) for name in stage] or list(_steps(plan))


def plan_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, str]:
    """Each step's change from ``saved`` to ``current``: ``{name: action}``, unchanged left out."""
    before, after = _steps(saved), _steps(current)
    saved_order, current_order = _order(saved), _order(current)
    common = [n for n in current_order if n in before]
    common_before = [n for n in saved_order if n in after]
    changes: dict[str, str] = {}
    for name in current_order:
        if name not in before:
            changes[name] = "inserted"
        elif after[name].get("fn") != before[name].get("fn"):
            changes[name] = "replaced"
        elif common.index(name) != common_before.index(name):
            changes[name] = "moved"
        elif after[name].get("params") != before[name].get("params"):
            changes[name] = "configured"
    for name in saved_order:
        if name not in after:
            changes[name] = "removed"
    return changes


def _cell(name: str | None, action: str | None) -> Text:
    if name is None:
        return Text("")
    if action is None:
        return Text(f"  {name}")
    text = Text(f"{MARKERS[action]} ")
    style = COLOURS[action] + (" strike" if action == "removed" else "")
    text.append(name, style=style)
    return text


def plan_change_view(saved: Mapping[str, Any], current: Mapping[str, Any], *,
                     saved_world: int | None = None, current_world: int | None = None
                     ) -> RenderableType | None:
    """The saved plan and the current one side by side, or ``None`` when nothing changed."""
    changes = plan_changes(saved, current)
    strategies = (saved.get("strategy"), current.get("strategy"))
    worlds = (saved_world, current_world)
    if not changes and strategies[0] == strategies[1] and worlds[0] == worlds[1]:
        return None

    def side(strategy: Any, world: int | None) -> str:
        return f"{strategy or 'no strategy'}" + (f" x {world}" if world is not None else "")

    title = (f"resume: the checkpoint's plan ({side(strategies[0], worlds[0])}) -> "
             f"this run's ({side(strategies[1], worlds[1])})")
    table = Table(**TABLE_STYLE)
    for column in ("#", "checkpoint's plan", "this run's plan", "change"):
        table.add_column(column, justify="right" if column == "#" else "left", overflow="fold")
    saved_order, current_order = _order(saved), _order(current)
    for position in range(max(len(saved_order), len(current_order))):
        left = saved_order[position] if position < len(saved_order) else None
        right = current_order[position] if position < len(current_order) else None
        left_action = "removed" if left is not None and changes.get(left) == "removed" else None
        right_action = changes.get(right) if right is not None else None
        notes = [a for a in (left_action, right_action) if a]
        table.add_row(Text(str(position + 1)), _cell(left, left_action),
                      _cell(right, right_action),
                      Text(", ".join(f"{MARKERS[a]} {a}" for a in notes)))
    legend = Text("  ".join(f"{MARKERS[a]} {a}" for a in
                            ("inserted", "removed", "moved", "replaced", "configured")))
    return Group(Text(title), table, legend)
