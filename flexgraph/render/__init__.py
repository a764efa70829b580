"""Views of a plan: text table, diff, JSON, Graphviz dot, Mermaid, timings.

Everything here reads a :class:`flexgraph.Plan` (or the executor's step records)
and returns text or a rich renderable; nothing plans or runs, and nothing
imports torch, so printing a plan is cheap and safe anywhere. The renderers are
deterministic: the same plan gives the same bytes, which is what makes plans
diffable in review and checkable in CI.

- :func:`plan_table`: the default ``flexgraph plan`` view.
- :func:`plan_diff`: base order and planned order side by side (``--diff``).
- :func:`plan_json` / :func:`plan_to_dict`: the stable ``flexgraph.plan/1`` schema.
- :func:`plan_dot`, :func:`plan_mermaid`: pictures (Graphviz, GitHub Markdown).
- :func:`explain_step`: why one step sits where it does (``--explain``).
- :func:`timings_table`: per-step time and memory after a run.
- :func:`pruned_steps` / :func:`derivation_lines`: the steps a derived rewrite
  pruned, each with its reason, and the lines that say so.
- :func:`estimate_view` / :func:`estimate_json`: a memory estimate (``--estimate``).
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
