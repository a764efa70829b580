"""Why a step sits where it does: ``flexgraph plan CONFIG --explain STEP``.

A thin layer over :meth:`flexgraph.Plan.explain`, which gives a planned step's
position, origin and incoming and outgoing edges with their reasons. It adds
the one case the plan cannot answer by itself: a base step the strategy took
out (``explain('resume')`` says which rewrite removed, replaced or fused it
instead of reporting an unknown step). A name neither graph has raises
:class:`~flexgraph.UnknownStepError` with a did-you-mean over both.
"""

from __future__ import annotations

from flexgraph.core.graph import unknown_step
from flexgraph.core.plan import Plan
from flexgraph.render._changes import gone_steps


def explain_step(plan: Plan, name: str) -> str:
    """Explain the place of step ``name`` in ``plan``.

    Parameters
    ----------
    plan : Plan
    name : str
        A step of the plan, or a base step the strategy took out.

    Returns
    -------
    str
        Several lines of plain text (no trailing newline).

    Raises
    ------
    UnknownStepError
        Neither the plan nor the base graph has ``name``; the message suggests
        close names.
    """
    if name in plan.graph:
        return plan.explain(name)
    gone = gone_steps(plan).get(name)
    if gone is None:
        known = set(plan.order) | set(plan.base_order)
        raise unknown_step(name, known, "explain")
    lines = [f"{name} is not in the plan: the base graph has it, the strategy took it out"]
    lines.append(f"  {gone}")
    if gone.into is not None:
        lines.append(f"  its work is done by {gone.into} (explain {gone.into} for its place)")
    return "\n".join(lines)
