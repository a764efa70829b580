"""Why a step sits where it does: ``flexgraph plan CONFIG --explain STEP``, base steps
taken out included.
"""

from __future__ import annotations

from flexgraph.core.graph import unknown_step
from flexgraph.core.plan import Plan
from flexgraph.render._changes import gone_steps


def explain_step(plan: Plan, name: str) -> str:
    """Lines on the place of ``name``, a planned step or a base step taken out."""
    if name in plan.graph:
        return plan.explain(name)
    gone = gone_steps(plan).get(name)
    if gone is None:
        known = set(plan.order) | set(plan.base_order)
        raise unknown_step(name, known, "explain")
    lines = [f"{name} is not in the plan: the base graph has it, the strategy took it out"]
    lines.append(f"  {gone}")
    if gone.rewrite.why:
        lines.append(f"    why: {gone.rewrite.why}")
    if gone.into is not None:
        lines.append(f"  its work is done by {gone.into} (explain {gone.into} for its place)")
    return "\n".join(lines)
