"""``flexgraph plan --format html``: the plan page, with the estimate or the candidates.

What :mod:`flexgraph.cli.plan_cmd` prints as a table, here as one
self-contained page (:mod:`flexgraph.render.html`). Without ``--estimate`` or
``--compare`` nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flexgraph.core.plan import Plan
from flexgraph.render.html import compare_page, plan_page


def page_of_plan(plan: Plan, strategy: Any, config: str,
                 report: dict[str, Any] | None = None) -> str:
    """The page of ``plan`` (its strategy's checks give the reasons), with ``report``'s
    memory per step when given."""
    checks = strategy.checks if strategy is not None else ()
    return plan_page(plan, checks=checks, estimate=report, source=config)


def page_of_candidates(spec: Any, report: dict[str, Any], config: str, compare: str,
                       plan_of: Callable[[Any], Plan]) -> str:
    """The ``--compare`` page: each candidate of ``compare`` with the plan ``plan_of`` makes
    of its strategy."""
    from flexgraph.training.estimate import amp_precision, parse_candidates

    candidates = parse_candidates(compare, spec.cfg.get("strategy"), amp_precision(spec.cfg))
    plans = {c.label: (plan_of(c.strategy), c.strategy.checks) for c in candidates}
    return compare_page(report, plans, source=config)
