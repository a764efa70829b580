"""The plan as a Mermaid flowchart, which GitHub renders inside Markdown.

Paste the output into a fenced ``mermaid`` block of an issue, a pull request or
a README and the plan appears as a picture. Mermaid is stricter than dot about
what may appear where, so node ids are generated (``s1_build_model``: the
1-based position plus the name reduced to ASCII letters, digits and ``_``; the
``s`` prefix keeps ids clear of keywords such as ``end`` and of the ``o`` / ``x``
edge heads) and labels are always quoted with Mermaid's entity escapes.
Each action gets a ``classDef``; edges passing an artifact are labelled with it,
pure ordering edges are dotted.
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
    """Escape ``text`` for a quoted Mermaid label (``#``, quotes, ``<>&|``).

    Parameters
    ----------
    text : str

    Returns
    -------
    str
        The text with each special character as a Mermaid entity code; line
        breaks become ``<br/>``.
    """
    escaped = "".join(_ENTITIES.get(char, char) for char in text)
    return "<br/>".join(escaped.splitlines()) if escaped else escaped


def node_ids(plan: Plan) -> dict[str, str]:
    """Step name -> Mermaid node id (``s<position>_<ascii name>``), unique by position."""
    return {
        name: f"s{i}_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
        for i, name in enumerate(plan.order, 1)
    }


def plan_mermaid(plan: Plan) -> str:
    """Render ``plan`` as Mermaid ``flowchart TD`` text.

    Parameters
    ----------
    plan : Plan

    Returns
    -------
    str
        One node per step (``name<br/>fn``) in execution order, one edge per
        derived edge, a ``classDef`` and ``class`` line per action that occurs;
        ends in a newline. Deterministic.
    """
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
