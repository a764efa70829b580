"""Views of a plan: text table, diff, JSON, Graphviz dot, Mermaid, HTML page, timings, estimate.

Nothing here plans, runs or imports torch. The same plan gives the same bytes,
so plans can be diffed in review and checked in CI.
"""

from flexgraph.render._changes import derivation_lines, pruned_steps
from flexgraph.render.diff import plan_diff
from flexgraph.render.dot import plan_dot
from flexgraph.render.estimate import estimate_json, estimate_view
from flexgraph.render.explain import explain_step
from flexgraph.render.json_view import SCHEMA, plan_json, plan_to_dict
from flexgraph.render.mermaid import plan_mermaid
from flexgraph.render.text import plan_table
from flexgraph.render.timings import timings_table

__all__ = [
    "SCHEMA",
    "derivation_lines",
    "estimate_json",
    "estimate_view",
    "explain_step",
    "plan_diff",
    "plan_dot",
    "plan_json",
    "plan_mermaid",
    "plan_table",
    "plan_to_dict",
    "pruned_steps",
    "timings_table",
]
