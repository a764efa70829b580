"""The plan as a Mermaid flowchart, which GitHub renders inside Markdown.

Node ids are generated (``s1_build_model``: the ``s`` keeps them clear of
keywords such as ``end`` and of the ``o`` / ``x`` edge heads); Mermaid is stricter than dot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from flexgraph.core.plan import Plan
from flexgraph.render._changes import ACTIONS, edge_artifacts, first_action, ordered_edges

CLASS_STYLES: Mapping[str, str] = {
    "inserted": "fill:#d8f3dc,stroke:#2b8a3e",
    "moved": "fill:#fff3bf,stroke:#e67700,stroke-dasharray:4 2",
    "replaced": "fill:#f3d9fa,stroke:#862e9c",
    "fused": "fill:#d0ebff,stroke:#1864ab,stroke-width:3px",
    "configured": "fill:#e7f5ff,stroke:#1971c2",
}
"""Mermaid ``classDef`` body per action."""

_ENTITIES = {"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "&": "#amp;", "|": "#124;"}


def escape(text: str) -> str:
    """Escape ``text`` for a quoted Mermaid label (entity codes; line breaks as ``<br/>``)."""
    escaped = "".join(_ENTITIES.get(char, char) for char in text)
    return "<br/>".join(escaped.splitlines()) if escaped else escaped


def node_ids(plan: Plan) -> dict[str, str]:
    """Step name -> Mermaid node id (``s<position>_<ascii name>``), unique by position."""
    return {
        name: f"s{i}_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
        for i, name in enumerate(plan.order, 1)
    }


def plan_mermaid(plan: Plan) -> str:
    """``plan`` as Mermaid ``flowchart TD`` text, with a ``classDef`` per action that occurs."""
    ids = node_ids(plan)
    title = " ".join((plan.strategy or "base graph (no strategy)").split())
    lines = ["flowchart TD", f"    %% flexgraph plan: {title}"]
    for step in plan.steps:
        label = escape(step.name) + "<br/>" + escape(step.fn_name)
        lines.append(f'    {ids[step.name]}["{label}"]')
    for edge in ordered_edges(plan):
        artifacts = edge_artifacts(plan, edge)
        source, target = ids[edge.source], ids[edge.target]
        if artifacts:
            lines.append(f'    {source} -->|"{escape(", ".join(artifacts))}"| {target}')
        else:
            lines.append(f"    {source} -.-> {target}")
    by_action: dict[str, list[str]] = {}
    for name in plan.order:
        by_action.setdefault(first_action(plan, name), []).append(ids[name])
    for action in ACTIONS:
        if action in by_action and action in CLASS_STYLES:
            lines.append(f"    classDef {action} {CLASS_STYLES[action]}")
            lines.append(f"    class {','.join(by_action[action])} {action}")
    return "\n".join(lines) + "\n"
