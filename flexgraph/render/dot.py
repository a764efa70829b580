"""The plan as a Graphviz digraph, for ``dot -Tsvg`` and the like.

Nodes are declared in execution order (Graphviz keeps it within a rank, so the
picture reads like the table). Every identifier is quoted and escaped.
"""

from __future__ import annotations

from collections.abc import Mapping

from flexgraph.core.plan import Plan
from flexgraph.render._changes import edge_artifacts, first_action, history, ordered_edges

NODE_STYLES: Mapping[str, str] = {
    "base": "",
    "inserted": 'style="filled", fillcolor="#d8f3dc"',
    "moved": 'style="filled,dashed", fillcolor="#fff3bf"',
    "replaced": 'style="filled", fillcolor="#f3d9fa"',
    "fused": 'style="filled", fillcolor="#d0ebff", peripheries=2',
    "configured": 'style="filled", fillcolor="#e7f5ff"',
}
"""Extra dot attributes of a node, by the action that placed it."""


def quote(text: str) -> str:
    """``text`` as a double-quoted dot string (escaped; line breaks as ``\\n``)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\r\n", "\\n").replace("\n", "\\n") + '"'


def _label(*lines: str) -> str:
    return '"' + "\\n".join(quote(line)[1:-1] for line in lines) + '"'


def plan_dot(plan: Plan) -> str:
    """``plan`` as Graphviz dot text: a node per step (``name\\nfn``), an edge per derived edge."""
    title = f"flexgraph plan: {plan.strategy or 'base graph'}"
    lines = [
        "digraph plan {",
        f"  label={quote(title)};",
        '  labelloc="t";',
        "  rankdir=TB;",
        '  node [shape=box, fontname="Helvetica"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for step in plan.steps:
        attributes = [f"label={_label(step.name, step.fn_name)}"]
        style = NODE_STYLES.get(first_action(plan, step.name), "")
        if style:
            attributes.append(style)
        entries = history(plan, step.name)
        if entries:
            tooltip = "; ".join(str(origin) for origin in entries)
            attributes.append(f"tooltip={quote(tooltip)}")
        lines.append(f"  {quote(step.name)} [{', '.join(attributes)}];")
    for edge in ordered_edges(plan):
        artifacts = edge_artifacts(plan, edge)
        kind = f"label={quote(', '.join(artifacts))}" if artifacts else 'style="dashed"'
        attributes = f"{kind}, tooltip={quote(edge.reason)}"
        lines.append(f"  {quote(edge.source)} -> {quote(edge.target)} [{attributes}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
