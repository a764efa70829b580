"""Graphs: a set of steps, with the edges between them derived, never stored.

Steps keep declaration order, the tie-break, so a graph always gives the same
plan; each artifact updated in place has the chain of its updaters. Edges:
producer -> updaters in chain order -> each consumer (unless it is ordered
``before`` an updater), plus each step's ``after`` / ``before``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

import attrs
import networkx as nx

from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.step import Step

T = TypeVar("T")


class GraphError(FlexgraphError, ValueError):
    """Base class of the ways a graph can be invalid."""


class DuplicateStepError(GraphError):
    """Two steps share one name."""


class UnknownStepError(GraphError, LookupError):
    """A name refers to a step the graph does not have; the message suggests close names."""


class DuplicateProducerError(GraphError):
    """Two steps provide the same artifact (or a step provides a graph input)."""


class MissingInputError(GraphError):
    """A step (or the run) needs an artifact that nothing provides and no input supplies."""


class AmbiguousOrderError(GraphError):
    """Two steps update one artifact and nothing says which runs first."""


class CycleError(GraphError):
    """The derived edges form a cycle; the message gives its path and each edge's reason."""


@attrs.frozen
class Edge:
    """A derived edge: ``source`` runs before ``target``, for ``reason`` (in words)."""

    source: str
    target: str
    reason: str


def unknown_step(name: str, known: Iterable[str], context: str = "") -> UnknownStepError:
    where = f"{context}: " if context else ""
    return UnknownStepError(f"{where}no step named {name!r}{did_you_mean(name, known)}")


def _freeze_chains(chains: Mapping[str, Iterable[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({a: tuple(c) for a, c in chains.items() if c})


@attrs.frozen
class Graph:
    """An immutable set of steps in declaration order, with updater chains.

    Examples
    --------
    >>> from flexgraph.core.step import Step
    >>> g = Graph.of([Step("a", "m:f", provides="x"), Step("b", "m:g", updates="x")])
    >>> g.edges()
    [Edge(source='a', target='b', reason='b updates x, made by a')]
    """

    steps: tuple[Step, ...] = attrs.field(converter=tuple)
    chains: Mapping[str, tuple[str, ...]] = attrs.field(
        converter=_freeze_chains, eq=lambda c: dict(c)
    )
    inputs: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    pending: tuple[Step, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        seen: set[str] = set()
        for s in self.steps + self.pending if self.pending else self.steps:
            if s.name in seen:
                raise DuplicateStepError(
                    f"two steps are named {s.name!r}; step names must be unique"
                )
            seen.add(s.name)

    @classmethod
    def of(cls, steps: Iterable[Step] = (), inputs: Iterable[str] = ()) -> Graph:
        """Make a graph from steps declared together; updaters chain in list order."""
        steps = tuple(steps)
        graph = cls(steps, {}, inputs)
        return attrs.evolve(graph, chains=_chains_in_order(steps))

    def add(self, step: Step) -> Graph:
        """A graph with ``step`` appended (see :meth:`extend`)."""
        return self.extend([step])

    def extend(self, steps: Iterable[Step] | Graph) -> Graph:
        """``steps`` appended, chained as :meth:`of` does; a user's step anchored ahead waits."""
        if isinstance(steps, Graph):
            return self | steps
        known = set(self.by_name)
        placed, pending = [], []
        for s in steps:
            if s.user and any(name not in known for name in s.after + s.before):
                pending.append(s)
            else:
                placed.append(s)
                known.add(s.name)
        return self | attrs.evolve(Graph.of(placed), pending=pending)

    def __or__(self, other: Graph) -> Graph:
        if not isinstance(other, Graph):
            return NotImplemented
        clash = [s.name for s in other.steps if s.name in self.by_name]
        if clash:
            raise DuplicateStepError(
                f"cannot combine graphs: both have step {clash[0]!r}; rename one or use a Replace"
            )
        merged = Graph(self.steps + other.steps, self.chains, self.inputs | other.inputs,
                       self.pending + other.pending)
        chains = dict(merged.chains)
        for artifact, incoming in other.chains.items():
            chain = list(chains.get(artifact, ()))
            if not chain:
                chains[artifact] = incoming
                continue
            previous = None
            for name in incoming:
                slot = merged._anchored_slot(merged.by_name[name], artifact, chain, previous)
                chain.insert(slot, name)
                previous = name
            chains[artifact] = tuple(chain)
        return attrs.evolve(merged, chains=chains)

    def remove(self, *names: str) -> Graph:
        """A graph without ``names``; references to them go, chains close over the gap."""
        for name in names:
            self.step(name)
        gone = set(names)
        steps = [
            s.evolve(
                after=tuple(a for a in s.after if a not in gone),
                before=tuple(b for b in s.before if b not in gone),
            )
            for s in self.steps
            if s.name not in gone
        ]
        chains = {a: tuple(n for n in c if n not in gone) for a, c in self.chains.items()}
        return Graph(steps, chains, self.inputs)

    def upstream(self, *targets: str) -> Graph:
        """The subgraph of ``targets`` and every step they depend on."""
        dag = self.digraph()
        keep = set()
        for target in targets:
            self.step(target)
            keep |= nx.ancestors(dag, target) | {target}
        return self.remove(*(s.name for s in self.steps if s.name not in keep))

    def with_inputs(self, *artifacts: str) -> Graph:
        """A graph that also takes ``artifacts`` from outside."""
        return attrs.evolve(self, inputs=self.inputs | set(artifacts))

    @cached_property
    def by_name(self) -> Mapping[str, Step]:
        return MappingProxyType({s.name: s for s in self.steps})

    @cached_property
    def position(self) -> Mapping[str, int]:
        """Declaration index of each step (the tie-break of plans)."""
        return MappingProxyType({s.name: i for i, s in enumerate(self.steps)})

    def step(self, name: str, context: str = "") -> Step:
        """The step called ``name``, else :class:`UnknownStepError` led by ``context``."""
        try:
            return self.by_name[name]
        except KeyError:
            raise unknown_step(name, self.by_name, context) from None

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    @cached_property
    def producers(self) -> Mapping[str, str]:
        """Artifact -> the step that provides it (checked unique by validate)."""
        return MappingProxyType({a: s.name for s in self.steps for a in s.provides})

    @property
    def artifacts(self) -> frozenset[str]:
        """Every artifact named by a step or an input."""
        names = set(self.inputs)
        for s in self.steps:
            names.update(s.requires, s.provides, s.updates)
        return frozenset(names)

    def edges(self) -> list[Edge]:
        """The derived edges, each with its reason."""
        return derive_edges(self)

    def digraph(self, edges: Iterable[Edge] | None = None) -> nx.DiGraph:
        """The derived edges (or ``edges``) as a DiGraph; parallel edges join their ``reason``."""
        dag = nx.DiGraph()
        dag.add_nodes_from(self.names)
        for e in self.edges() if edges is None else edges:
            if dag.has_edge(e.source, e.target):
                dag.edges[e.source, e.target]["reason"] += "; " + e.reason
            else:
                dag.add_edge(e.source, e.target, reason=e.reason)
        return dag

    def _anchored_slot(
        self, step: Step, artifact: str, chain: list[str], previous: str | None = None
    ) -> int:
        """Where ``step`` goes in ``chain`` given its own ordering edges.

        An unknown anchor is reported first: read as "no edge" it would surface as an
        ambiguous order, hiding the typo.
        """
        for field in ("after", "before"):
            for name in getattr(step, field):
                if name not in self.by_name:
                    where = f"step {step.name!r} says {field}={name!r}"
                    raise unknown_step(name, self.by_name, where)
        if not chain:  # the first updater of this artifact: nothing to order against
            return 0
        after = {n for n in chain if n in step.after or step.name in self.by_name[n].before}
        before = {n for n in chain if n in step.before or step.name in self.by_name[n].after}
        if previous is not None and previous in chain:
            after.add(previous)
        if after:
            return max(chain.index(n) for n in after) + 1
        if before:
            return min(chain.index(n) for n in before)
        if self.producers.get(artifact) in step.after:
            return 0
        raise AmbiguousOrderError(
            f"steps {step.name!r} and {chain[-1]!r} both update {artifact!r} with no order "
            f"between them; give {step.name!r} after= or before= one of: {', '.join(chain)}"
        )

    def splice(self, step: Step, index: int) -> Graph:
        """Insert ``step`` at declaration ``index``, and into its chains next to its anchor."""
        steps = list(self.steps)
        steps.insert(index, step)
        placed = Graph(steps, self.chains, self.inputs)
        chains = dict(self.chains)
        for artifact in step.updates:
            chain = list(chains.get(artifact, ()))
            try:
                slot = placed._anchored_slot(step, artifact, chain)
            except AmbiguousOrderError:
                slot = sum(1 for n in chain if placed.position[n] < index)
            chain.insert(slot, step.name)
            chains[artifact] = tuple(chain)
        return attrs.evolve(placed, chains=chains)


def _chains_in_order(steps: tuple[Step, ...]) -> dict[str, tuple[str, ...]]:
    """Chain each artifact's updaters: explicit edges among them, else list order."""
    index = {s.name: i for i, s in enumerate(steps)}
    by_name = {s.name: s for s in steps}
    updaters: dict[str, list[str]] = {}
    for s in steps:
        for artifact in s.updates:
            updaters.setdefault(artifact, []).append(s.name)
    chains = {}
    for artifact, names in updaters.items():
        if len(names) == 1:
            chains[artifact] = tuple(names)
            continue
        members = set(names)
        order = nx.DiGraph()
        order.add_nodes_from(names)
        for name in names:
            step = by_name[name]
            order.add_edges_from((a, name) for a in step.after if a in members)
            order.add_edges_from((name, b) for b in step.before if b in members)
        try:
            # A step that must precede others sorts where the earliest of them
            # was declared: [b, c, d(before=b)] chains as d, b, c.
            rank = {
                n: (min(index[m] for m in nx.descendants(order, n) | {n}), index[n]) for n in names
            }
            chains[artifact] = tuple(nx.lexicographical_topological_sort(order, key=rank.get))
        except nx.NetworkXUnfeasible:
            chains[artifact] = tuple(names)  # the cycle check reports it with its path
    return chains


def derive_edges(graph: Graph, edge: Callable[[str, str, str], T] = Edge) -> list[T]:
    """Every edge of ``graph``, made by ``edge(source, target, reason)`` (validation's: a tuple)."""
    edges: list[T] = []
    by_name = graph.by_name
    producers = graph.producers
    for s in graph.steps:
        for a in s.after:
            edges.append(edge(a, s.name, f"{s.name} says after={a}"))
        for b in s.before:
            edges.append(edge(s.name, b, f"{s.name} says before={b}"))
    for artifact, chain in graph.chains.items():
        producer = producers.get(artifact)
        if producer is not None:
            reason = f"{chain[0]} updates {artifact}, made by {producer}"
            edges.append(edge(producer, chain[0], reason))
        for first, second in zip(chain, chain[1:], strict=False):
            edges.append(edge(first, second, f"{second} updates {artifact} after {first}"))
    position_in_chain = {a: {n: i for i, n in enumerate(c)} for a, c in graph.chains.items()}
    for s in graph.steps:
        for artifact in s.requires:
            chain = graph.chains.get(artifact, ())
            producer = producers.get(artifact)
            if not chain:
                if producer is not None:
                    edges.append(edge(producer, s.name, f"{s.name} requires {artifact}"))
                continue
            positions = position_in_chain[artifact]
            ahead = [
                positions[n]
                for n in chain
                if n in s.before or s.name in by_name[n].after
            ]
            cut = min(ahead) if ahead else len(chain)
            if cut == 0:
                if producer is not None:
                    edges.append(edge(producer, s.name, f"{s.name} requires {artifact}"))
                continue
            last = chain[cut - 1]
            reason = f"{s.name} requires {artifact}, last updated by {last}"
            edges.append(edge(last, s.name, reason))
    return edges
