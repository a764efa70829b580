"""Plan checks: what a strategy's order must keep true, whoever rewrites it later.

A strategy's rewrites put steps in an order for a reason (FSDP shards before it
builds the optimizer, because the optimizer must hold the sharded parameters).
A later rewrite (a user's, or a strategy built on top of this one) can undo that
order without breaking the graph's own rules: no cycle, no missing input. A
check states the reason as data, so :func:`~flexgraph.core.plan.make_plan`
refuses such a plan with a message that says *why* the order matters, instead
of letting it fail at run time with a shape error deep inside torch.

Two kinds suffice for the orders strategies depend on:

- :class:`Precedes`: one step must run before another (a path between them in
  the plan's DAG, not a tie-break of the order);
- :class:`Runs`: a step must run a given function (a whole-model loader in
  place of the sharded one is a silent no-op on sharded weights).
"""

from __future__ import annotations

import attrs
import networkx as nx

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph


class PlanCheckError(FlexgraphError, ValueError):
    """A plan breaks an order or a choice its strategy depends on; says why.

    Raised by :func:`~flexgraph.make_plan` once all rewrites are applied. The
    message names the strategy, what is wrong, the check's reason and the fix:
    ``strategy 'fsdp': build_optim_wrapper must run after fully_shard: <why>;
    move build_optim_wrapper after fully_shard``.
    """


@attrs.frozen
class Precedes:
    """``first`` must run before ``then``; ``why`` says what breaks otherwise.

    When ``then`` is not in the plan (an entry point that builds no optimizer)
    there is nothing to protect; when ``first`` is missing but ``then`` is
    there, the plan is refused.

    Parameters
    ----------
    first, then : str
        Step names. The plan must hold a path of derived edges from ``first``
        to ``then``; coming earlier in the order by a tie-break is not enough.
    why : str
        What goes wrong otherwise, put in the error message.

    Examples
    --------
    >>> from flexgraph import Graph, Remove, Step, Strategy, make_plan
    >>> graph = Graph.of([Step("shard", "m:shard", updates="model"),
    ...                   Step("optim", "m:optim", requires="model", provides="opt")],
    ...                  inputs=["model"])
    >>> sharded = Strategy("sharded", checks=[
    ...     Precedes("shard", "optim", why="the optimizer must hold the shards")])
    >>> make_plan(graph, sharded).order
    ('shard', 'optim')
    >>> try:
    ...     make_plan(graph, sharded.then(Remove("shard")))
    ... except PlanCheckError as error:  # doctest: +NORMALIZE_WHITESPACE
    ...     print(error)
    strategy 'sharded': optim needs shard before it, and the plan has no shard:
    the optimizer must hold the shards; keep shard in the plan
    """

    first: str
    then: str
    why: str

    def describe(self) -> str:
        """The check in words: ``"a runs before b"``."""
        return f"{self.first} runs before {self.then}"

    def verify(self, graph: Graph, dag: nx.DiGraph) -> tuple[str, str] | None:
        """``None`` when the plan keeps the order, else (what is wrong, the fix).

        Parameters
        ----------
        graph : Graph
            The rewritten graph.
        dag : networkx.DiGraph
            Its derived edges (:meth:`Graph.digraph`).

        Returns
        -------
        tuple of (str, str), or None
        """
        if self.then not in graph:
            return None
        if self.first not in graph:
            return (f"{self.then} needs {self.first} before it, and the plan has no "
                    f"{self.first}", f"keep {self.first} in the plan")
        if not nx.has_path(dag, self.first, self.then):
            return (f"{self.then} must run after {self.first}",
                    f"move {self.then} after {self.first}")
        return None


@attrs.frozen
class Runs:
    """Step ``step`` must run ``fn`` (a ``"module:attr"`` reference).

    When ``step`` is not in the plan there is nothing to check.

    Parameters
    ----------
    step : str
        The step name.
    fn : str
        The ``"module:qualname"`` its function must have (:attr:`Step.fn_name`).
    why : str
        What goes wrong otherwise, put in the error message.
    """

    step: str
    fn: str
    why: str

    def describe(self) -> str:
        """The check in words: ``"a runs m:f"``."""
        return f"{self.step} runs {self.fn}"

    def verify(self, graph: Graph, dag: nx.DiGraph) -> tuple[str, str] | None:
        """``None`` when the step runs ``fn``, else (what is wrong, the fix).

        Parameters
        ----------
        graph : Graph
            The rewritten graph.
        dag : networkx.DiGraph
            Unused; the signature is that of every check.

        Returns
        -------
        tuple of (str, str), or None
        """
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
    """Raise :class:`PlanCheckError` for the first check ``graph`` breaks.

    Parameters
    ----------
    strategy_name : str
        The strategy whose checks these are, named in the error.
    checks : tuple of Check
        The strategy's checks.
    graph : Graph
        The rewritten graph.
    dag : networkx.DiGraph
        Its ordering edges.

    Raises
    ------
    PlanCheckError
        A check the graph breaks: the problem, why the strategy needs it, and the
        fix.
    """
    for check in checks:
        found = check.verify(graph, dag)
        if found is not None:
            problem, fix = found
            raise PlanCheckError(f"strategy {strategy_name!r}: {problem}: {check.why}; {fix}")
