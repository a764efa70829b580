"""Plans: a strategy applied to a graph, validated, ordered, and attributed.

:func:`make_plan` validates the base graph and the graph after each rewrite,
so a rewrite that breaks it is refused naming the strategy and the rewrite.
A :class:`Plan`'s order is deterministic (ties follow declaration order) and
records where every step came from. ``targets`` cut the plan *after* the
rewrites, so an entry point (``val``) keeps what the strategy made it depend on
without the strategy knowing which entry runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import attrs
import networkx as nx

from flexgraph.core.checks import verify_checks
from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Edge, Graph
from flexgraph.core.rewrite import Rewrite
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy
from flexgraph.core.validate import check, validate


@attrs.frozen
class Origin:
    """Where a step's place in the plan comes from; ``str()`` gives it in words.

    Parameters
    ----------
    action : str
        ``"base"``, or what a rewrite did (``"inserted"``, ``"moved"``, ...).
    strategy : str, optional
        The rewrite's strategy (``"derived"`` for a derived rewrite).
    index : int, optional
        The rewrite's position, from 0.
    rewrite : str, optional
    """

    action: str = "base"
    strategy: str | None = None
    index: int | None = None
    rewrite: str | None = None

    def __str__(self) -> str:
        if self.action == "base":
            return "base"
        return f"{self.short}: {self.rewrite}"

    @property
    def short(self) -> str:
        """``"base"`` or e.g. ``"replaced by ddp #2"`` (for narrow columns)."""
        if self.action == "base":
            return "base"
        return f"{self.action} by {self.strategy} #{self.index + 1}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return attrs.asdict(self)


BASE = Origin()


@attrs.frozen
class AppliedRewrite:
    """One rewrite as applied: its position, text and what it did to which step."""

    index: int
    strategy: str
    description: str
    kind: str
    touched: Mapping[str, str]
    consumed: Mapping[str, str | None] = attrs.field(factory=dict)
    """Steps this rewrite took out -> the step in their place (None if removed)."""


def _order(graph: Graph, dag: nx.DiGraph) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    key = graph.position.__getitem__
    order = tuple(nx.lexicographical_topological_sort(dag, key=key))
    stages = tuple(tuple(sorted(gen, key=key)) for gen in nx.topological_generations(dag))
    return order, stages


@attrs.frozen
class Plan:
    """The result of applying a strategy to a graph; see :func:`make_plan`.

    Parameters
    ----------
    base, graph : Graph
        The graph as given, and after the rewrites (cut to ``targets``).
    strategy : str or None
    order : tuple of str
        Execution order.
    stages : tuple of tuple of str
        Topological generations: no step in a stage depends on another in it.
    base_order : tuple of str
    rewrites : tuple of AppliedRewrite
    history : mapping of str to tuple of Origin
        Each touched step's origins, oldest first.
    edges : tuple of Edge
    """

    base: Graph
    graph: Graph
    strategy: str | None
    order: tuple[str, ...]
    stages: tuple[tuple[str, ...], ...]
    base_order: tuple[str, ...]
    rewrites: tuple[AppliedRewrite, ...]
    history: Mapping[str, tuple[Origin, ...]]
    edges: tuple[Edge, ...]

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps in execution order."""
        return tuple(self.graph.by_name[n] for n in self.order)

    def origin(self, name: str) -> Origin:
        """The last rewrite that placed or changed step ``name``, or ``BASE``."""
        self.graph.step(name)
        history = self.history.get(name, ())
        return history[-1] if history else BASE

    def explain(self, name: str) -> str:
        """Why ``name`` sits where it does, in lines: its origins and edges (``--explain``)."""
        step = self.graph.step(name)
        position = self.order.index(name)
        lines = [f"{name} is step {position + 1} of {len(self.order)} ({step.fn_name})"]
        history = self.history.get(name, ())
        if history:
            lines += [f"  {h}" for h in history]
        else:
            lines.append("  declared by the base graph, untouched by the strategy")
        incoming = sorted(
            (e for e in self.edges if e.target == name), key=lambda e: self.order.index(e.source)
        )
        outgoing = sorted(
            (e for e in self.edges if e.source == name), key=lambda e: self.order.index(e.target)
        )
        if incoming:
            lines.append("  runs after:")
            lines += [f"    {e.source}: {e.reason}" for e in incoming]
        if outgoing:
            lines.append("  runs before:")
            lines += [f"    {e.target}: {e.reason}" for e in outgoing]
        if not incoming and not outgoing:
            lines.append("  no edges: its place comes from declaration order alone")
        return "\n".join(lines)


def _shape(graph: Graph) -> tuple[object, ...]:
    """Everything validation reads; a rewrite that leaves it alone (a Configure) needs no check."""
    interfaces = tuple((s.name, s.requires, s.provides, s.updates, s.after, s.before)
                       for s in graph.steps)
    return graph.inputs, tuple(graph.chains.items()), interfaces


def _consumed(before: Graph, after: Graph, touched: Mapping[str, str]) -> dict[str, str | None]:
    """Steps of ``before`` that ``after`` lacks, each with the step that took its place."""
    into = next((n for n, a in touched.items() if a in ("replaced", "fused")), None)
    return {n: into for n in before.names if n not in after}


DERIVED = "derived"
"""The strategy name a plan gives derived rewrites."""


def _apply_all(rewrites: tuple[Rewrite, ...], owner: str, where: str, current: Graph,
               applied: list[AppliedRewrite], history: dict[str, list[Origin]]) -> Graph:
    """Apply ``rewrites``, validating after each; ``where`` starts an error's message."""
    shape = _shape(current)
    for index, rewrite in enumerate(rewrites):
        before = current
        try:
            current, touched = rewrite.apply(current)
            previous, shape = shape, _shape(current)
            if shape != previous:
                check(current)
        except FlexgraphError as exc:
            at = f"{where} #{index + 1}"
            if not str(exc).startswith(rewrite.describe()):
                at += f" ({rewrite.describe()})"
            raise type(exc)(f"{at}: {exc}") from exc
        applied.append(
            AppliedRewrite(
                index=index,
                strategy=owner,
                description=rewrite.describe(),
                kind=rewrite.kind,
                touched=MappingProxyType(dict(touched)),
                consumed=MappingProxyType(_consumed(before, current, touched)),
            )
        )
        for name, action in touched.items():
            origin = Origin(action, owner, index, rewrite.describe())
            history.setdefault(name, []).append(origin)
    return current


def make_plan(
    graph: Graph, strategy: Strategy | None = None, *, targets: tuple[str, ...] = (),
    derived: Sequence[Rewrite] = (),
) -> Plan:
    """Validate ``graph``, apply ``strategy`` rewrite by rewrite, and order it.

    Parameters
    ----------
    graph : Graph
    strategy : Strategy, optional
        Its rewrites are applied in order; its checks are verified on the result.
    targets : tuple of str, optional
        Cut the rewritten graph to these steps and what they depend on.
    derived : sequence of Rewrite, optional
        Rewrites found from the run's inputs (a :class:`~flexgraph.core.rewrite.Prune`),
        applied before the strategy's and listed as ``derived #1``, ...

    Returns
    -------
    Plan

    Examples
    --------
    >>> from flexgraph import Graph, Insert, Step, Strategy
    >>> graph = Graph.of([Step("load", "m:load", provides="data"),
    ...                   Step("train", "m:train", requires="data")])
    >>> clean = Strategy("clean", [Insert(Step("clean", "m:clean", updates="data"),
    ...                                   after="load")])
    >>> plan = make_plan(graph, clean)
    >>> plan.order
    ('load', 'clean', 'train')
    >>> print(plan.origin("clean"))
    inserted by clean #1: insert clean after load
    """
    base_dag = validate(graph)
    base_order, _ = _order(graph, base_dag)
    applied: list[AppliedRewrite] = []
    history: dict[str, list[Origin]] = {}
    current = _apply_all(tuple(derived), DERIVED, "derived rewrite", graph, applied, history)
    if strategy is not None:
        current = _apply_all(strategy.rewrites, strategy.name,
                             f"strategy {strategy.name!r}, rewrite", current, applied, history)
    dag = base_dag if current is graph else current.digraph()
    if strategy is not None and strategy.checks:
        verify_checks(strategy.name, strategy.checks, current, dag)
    if targets:
        current = current.upstream(*targets)
        dag = current.digraph()
        known = tuple(t for t in targets if t in graph)  # a rewrite may have made the others
        if known:
            needed = graph.upstream(*known)
            base_order = tuple(n for n in base_order if n in needed)
    order, stages = _order(current, dag)
    edges = tuple(
        Edge(u, v, data["reason"]) for u, v, data in dag.edges(data=True)
    )
    return Plan(
        base=graph,
        graph=current,
        strategy=strategy.name if strategy else None,
        order=order,
        stages=stages,
        base_order=base_order,
        rewrites=tuple(applied),
        history=MappingProxyType(
            {n: tuple(h) for n, h in history.items() if n in current}
        ),
        edges=edges,
    )
