"""Plan checks: orders and choices a strategy relies on, stated as data.

A later rewrite can undo a strategy's order without breaking the graph's own
rules (FSDP shards before it builds the optimizer); a check makes
:func:`~flexgraph.core.plan.make_plan` refuse that plan instead of failing at run time.
"""

from __future__ import annotations

import attrs
import networkx as nx

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph


class PlanCheckError(FlexgraphError, ValueError):
    """A plan breaks an order or a choice its strategy depends on."""


@attrs.frozen
class Precedes:
    """``first`` must run before ``then`` (a path of derived edges, not a tie-break).

    Nothing is checked when ``then`` is not planned; a plan without ``first`` is
    refused unless ``first_optional``.

    Parameters
    ----------
    first, then : str
    why : str
        What goes wrong otherwise, put in the error message.
    first_optional : bool, optional
    """

    first: str
    then: str
    why: str
    first_optional: bool = False

    def describe(self) -> str:
        return f"{self.first} runs before {self.then}"

    def verify(self, graph: Graph, dag: nx.DiGraph) -> tuple[str, str] | None:
        """``None`` when the plan keeps the order, else (what is wrong, the fix)."""
        if self.then not in graph:
            return None
        if self.first not in graph:
            if self.first_optional:
                return None
            return (f"{self.then} needs {self.first} before it, and the plan has no "
                    f"{self.first}", f"keep {self.first} in the plan")
        if not nx.has_path(dag, self.first, self.then):
            return (f"{self.then} must run after {self.first}",
                    f"move {self.then} after {self.first}")
        return None


@attrs.frozen
class Runs:
    """Step ``step``, when planned, must run ``fn`` (its :attr:`Step.fn_name`).

    Parameters
    ----------
    step : str
    fn : str
    why : str
        What goes wrong otherwise, put in the error message.
    """

    step: str
    fn: str
    why: str

    def describe(self) -> str:
        return f"{self.step} runs {self.fn}"

    def verify(self, graph: Graph, dag: nx.DiGraph) -> tuple[str, str] | None:
        """``None`` when the step runs ``fn``, else (what is wrong, the fix)."""
        del dag
        if self.step not in graph:
            return None
        actual = graph.by_name[self.step].fn_name
        if actual != self.fn:
            return (f"{self.step} runs {actual}, not {self.fn}",
                    f"keep {self.fn} as {self.step}")
        return None


Check = Precedes | Runs


def verify_checks(strategy_name: str, checks: tuple[Check, ...], graph: Graph,
                  dag: nx.DiGraph) -> None:
    """Raise :class:`PlanCheckError` for the first of ``checks`` that ``graph`` breaks.

    Parameters
    ----------
    strategy_name : str
    checks : tuple of Check
    graph : Graph
    dag : networkx.DiGraph
    """
    for check in checks:
        found = check.verify(graph, dag)
        if found is not None:
            problem, fix = found
            raise PlanCheckError(f"strategy {strategy_name!r}: {problem}: {check.why}; {fix}")
