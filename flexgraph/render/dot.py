"""The plan as a Graphviz digraph, for ``dot -Tsvg`` and the like.

Nodes are declared in execution order (Graphviz keeps declaration order among
nodes of one rank, so the picture reads like the table). Each node shows the
step and its function; a step a rewrite placed or changed is filled in its
action's colour and carries its origin as a tooltip. Edges that pass an artifact
are labelled with it; pure ordering edges (``after`` / ``before``) are dashed.
Every identifier and label is a quoted, escaped string, so any step name or
function reference gives valid dot.
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
    """Return ``text`` as a double-quoted dot string (backslashes and quotes escaped).

    Parameters
    ----------
    text : str

    Returns
    -------
    str
        ``"..."``; line breaks become dot's ``\\n`` escape.
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\r\n", "\\n").replace("\n", "\\n") + '"'


def _label(*lines: str) -> str:
    return '"' + "\\n".join(quote(line)[1:-1] for line in lines) + '"'


def plan_dot(plan: Plan) -> str:
    """Render ``plan`` as Graphviz dot text.

    Parameters
    ----------
    plan : Plan

    Returns
    -------
    str
        A ``digraph`` (ending in a newline) with one node per step, labelled
        ``name\\nfn``, and one edge per derived edge. Deterministic.
    """
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
        # an edge that passes artifacts is labelled with them; an ordering edge is dashed
        kind = f"label={quote(', '.join(artifacts))}" if artifacts else 'style="dashed"'
        attributes = f"{kind}, tooltip={quote(edge.reason)}"
        lines.append(f"  {quote(edge.source)} -> {quote(edge.target)} [{attributes}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
