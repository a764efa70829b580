"""Graphs: a set of steps, with the edges between them derived, never stored.

A :class:`Graph` keeps three things:

- ``steps``: the steps in declaration order. That order breaks ties when the
  plan is made, so the same graph always gives the same plan.
- ``chains``: for each artifact that steps update in place, the order of its
  updaters (``model``: ``init_weights``, ``load_checkpoint``, ``wrap_model``).
  This is data because it is what strategies rearrange: a move splices a step
  out of a chain and in at its new place, re-linking its neighbours.
- ``inputs``: artifacts supplied from outside (``cfg``), which need no producer.

Edges are derived from those (see :func:`derive_edges`):

1. producer -> first updater -> ... -> last updater, per artifact;
2. producer or last updater -> every consumer (a step that ``requires`` the
   artifact), unless the consumer is ordered ``before`` some updater, in which
   case it follows only the updaters ahead of that one;
3. the explicit ``after`` / ``before`` edges of each step.

Steps declared together in one list chain in list order (explicit edges among
them win). A step added to an existing graph that updates an artifact already
updated there must say where it goes (``after`` / ``before`` a member of the
chain); otherwise :class:`AmbiguousOrderError`.
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
    """Base class of the ways a graph can be invalid.

    Raised while a graph is built or combined, and by validation
    (:func:`flexgraph.make_plan` validates the base graph and the graph after
    every rewrite; a rewrite's error starts with the strategy and the rewrite).
    """


class DuplicateStepError(GraphError):
    """Two steps share one name.

    Raised when a graph is built, combined (``|``, :meth:`Graph.extend`), or
    given a step by an ``Insert``, ``Replace`` or ``Fuse`` under a name it
    already has.
    """


class UnknownStepError(GraphError, LookupError):
    """A name refers to a step the graph does not have.

    The message suggests close names: ``no step named 'biuld_model' (did you
    mean 'build_model'?)``. Raised by :meth:`Graph.step` and everything that
    looks a step up through it (rewrites, ``after`` / ``before`` edges,
    :meth:`Plan.origin`).
    """


class DuplicateProducerError(GraphError):
    """Two steps provide the same artifact (or a step provides a graph input).

    Raised by validation; the message names both steps and suggests making the
    second an updater of the artifact instead.
    """


class MissingInputError(GraphError):
    """A step needs an artifact that nothing provides and no input supplies.

    Raised by validation (the message names the step and the artifact, and
    suggests close artifact names), and by :meth:`Executor.run` when the run's
    context lacks one of the graph's inputs.
    """


class AmbiguousOrderError(GraphError):
    """Two steps update one artifact and nothing says which runs first.

    Raised when a step added to an existing graph updates an artifact the
    graph already updates, without ``after`` / ``before`` naming a member of
    that artifact's chain; the message names both steps, the artifact and the
    chain to choose from.
    """


class CycleError(GraphError):
    """The derived edges form a cycle; the message prints its path.

    Each edge of the path comes with its reason, e.g. ``cycle: a -> b -> a (b
    requires x; a requires y)``.
    """


@attrs.frozen
class Edge:
    """A derived edge ``source -> target`` and the reason it exists.

    Graphs never store edges: :meth:`Graph.edges` derives them, and
    :attr:`Plan.edges` holds those of the planned graph.

    Parameters
    ----------
    source, target : str
        Step names: ``source`` runs before ``target``.
    reason : str
        Why, in words (``"b requires x"``, ``"b updates x after a"``,
        ``"a says before=b"``); edges that exist for several reasons join them
        with ``"; "`` in :meth:`Graph.digraph`.
    """

    source: str
    target: str
    reason: str


def unknown_step(name: str, known: Iterable[str], context: str = "") -> UnknownStepError:
    """Build the error for a step name that is not in the graph."""
    where = f"{context}: " if context else ""
    return UnknownStepError(f"{where}no step named {name!r}{did_you_mean(name, known)}")


def _freeze_chains(chains: Mapping[str, Iterable[str]]) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({a: tuple(c) for a, c in chains.items() if c})


@attrs.frozen
class Graph:
    """An immutable set of steps in declaration order, with updater chains.

    Build one with :meth:`of` (or ``Graph.of([...])``), then compose with
    :meth:`add`, :meth:`extend`, ``|`` (union), :meth:`remove` and
    :meth:`upstream`. Each operation returns a new graph. A graph is iterable
    (its steps, in declaration order), sized, and ``name in graph`` asks for a
    step by name.

    Parameters
    ----------
    steps : iterable of Step
        In declaration order, which breaks ties when a plan is made.
    chains : mapping of str to sequence of str
        For each artifact that steps update in place, its updaters in order.
        :meth:`of` derives them; pass them directly only to rebuild a graph.
    inputs : iterable of str, optional
        Artifacts supplied from outside (``cfg``), which need no producer.

    Raises
    ------
    DuplicateStepError
        Two steps share one name.

    Examples
    --------
    >>> from flexgraph.core.step import Step
    >>> g = Graph.of([Step("a", "m:f", provides="x"), Step("b", "m:g", updates="x")])
    >>> [s.name for s in g]
    ['a', 'b']
    >>> g.edges()
    [Edge(source='a', target='b', reason='b updates x, made by a')]
    >>> "b" in g.remove("b")
    False
    """

    steps: tuple[Step, ...] = attrs.field(converter=tuple)
    chains: Mapping[str, tuple[str, ...]] = attrs.field(
        converter=_freeze_chains, eq=lambda c: dict(c)
    )
    inputs: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)

    def __attrs_post_init__(self) -> None:
        seen: set[str] = set()
        for s in self.steps:
            if s.name in seen:
                raise DuplicateStepError(
                    f"two steps are named {s.name!r}; step names must be unique"
                )
            seen.add(s.name)

    # construction -----------------------------------------------------------

    @classmethod
    def of(cls, steps: Iterable[Step] = (), inputs: Iterable[str] = ()) -> Graph:
        """Make a graph from steps declared together, chained in list order.

        Parameters
        ----------
        steps : iterable of Step
            The steps, in declaration order. Updaters of one artifact chain in
            this order, unless their own ``after`` / ``before`` say otherwise.
        inputs : iterable of str, optional
            Artifacts supplied from outside.

        Returns
        -------
        Graph

        Raises
        ------
        DuplicateStepError
            Two steps share one name.
        """
        steps = tuple(steps)
        graph = cls(steps, {}, inputs)
        return attrs.evolve(graph, chains=_chains_in_order(steps))

    def add(self, step: Step) -> Graph:
        """Return a graph with ``step`` appended (see :meth:`extend`).

        Parameters
        ----------
        step : Step

        Returns
        -------
        Graph

        Raises
        ------
        DuplicateStepError
            The graph has a step of that name.
        AmbiguousOrderError
            ``step`` updates an artifact the graph already updates, and its
            ``after`` / ``before`` name no member of that artifact's chain.
        UnknownStepError
            ``step`` joins an updater chain and its ``after`` / ``before`` names
            a step that does not exist (elsewhere, validation reports such a
            name).
        """
        return self.extend([step])

    def extend(self, steps: Iterable[Step] | Graph) -> Graph:
        """Return a graph with ``steps`` appended, declared together.

        A new step that updates an artifact this graph already updates is spliced
        into that chain next to the member it names in ``after`` / ``before``.

        Parameters
        ----------
        steps : iterable of Step, or Graph
            New steps, chained among themselves as :meth:`of` chains them.

        Returns
        -------
        Graph

        Raises
        ------
        DuplicateStepError
            A new step has the name of one in this graph.
        AmbiguousOrderError
            A new updater of an artifact names no member of its chain in
            ``after`` / ``before``.
        UnknownStepError
            A new step joins an updater chain of this graph and its ``after`` /
            ``before`` names a step that does not exist.
        """
        other = steps if isinstance(steps, Graph) else Graph.of(steps)
        return self | other

    def __or__(self, other: Graph) -> Graph:
        """Union: ``other``'s steps appended, chains merged (see :meth:`extend`)."""
        if not isinstance(other, Graph):
            return NotImplemented
        clash = [s.name for s in other.steps if s.name in self.by_name]
        if clash:
            raise DuplicateStepError(
                f"cannot combine graphs: both have step {clash[0]!r}; rename one or use a Replace"
            )
        merged = Graph(self.steps + other.steps, self.chains, self.inputs | other.inputs)
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
        """Return a graph without ``names``; ordering references to them are dropped.

        Parameters
        ----------
        *names : str
            Steps to take out. Other steps' ``after`` / ``before`` entries that
            name them go too; the updater chains close over the gap.

        Returns
        -------
        Graph

        Raises
        ------
        UnknownStepError
            One of ``names`` is not a step of this graph.
        """
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
        """Return the subgraph of ``targets`` and every step they depend on.

        Parameters
        ----------
        *targets : str
            Step names; each is kept with all its ancestors along the derived
            edges.

        Returns
        -------
        Graph

        Raises
        ------
        UnknownStepError
            One of ``targets`` is not a step of this graph.
        """
        dag = self.digraph()
        keep = set()
        for target in targets:
            self.step(target)
            keep |= nx.ancestors(dag, target) | {target}
        return self.remove(*(s.name for s in self.steps if s.name not in keep))

    def with_inputs(self, *artifacts: str) -> Graph:
        """Return a graph that also takes ``artifacts`` from outside."""
        return attrs.evolve(self, inputs=self.inputs | set(artifacts))

    # lookup -----------------------------------------------------------------

    @cached_property
    def by_name(self) -> Mapping[str, Step]:
        """Steps by name."""
        return MappingProxyType({s.name: s for s in self.steps})

    @cached_property
    def position(self) -> Mapping[str, int]:
        """Declaration index of each step (the tie-break of plans)."""
        return MappingProxyType({s.name: i for i, s in enumerate(self.steps)})

    def step(self, name: str, context: str = "") -> Step:
        """Return the step called ``name``, or raise with a did-you-mean.

        Parameters
        ----------
        name : str
        context : str, optional
            What was looking, put at the start of the error message (a
            rewrite passes its description).

        Returns
        -------
        Step

        Raises
        ------
        UnknownStepError
            No step is called ``name``; the message suggests close names.
        """
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
        """Step names in declaration order."""
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

    # edges ------------------------------------------------------------------

    def edges(self) -> list[Edge]:
        """The derived edges, each with its reason (see the module docstring)."""
        return derive_edges(self)

    def digraph(self, edges: Iterable[Edge] | None = None) -> nx.DiGraph:
        """The derived edges (or ``edges``, if given) as a networkx DiGraph.

        Each edge has the attribute ``reason``; parallel edges join theirs.
        """
        dag = nx.DiGraph()
        dag.add_nodes_from(self.names)
        for e in self.edges() if edges is None else edges:
            if dag.has_edge(e.source, e.target):
                dag.edges[e.source, e.target]["reason"] += "; " + e.reason
            else:
                dag.add_edge(e.source, e.target, reason=e.reason)
        return dag

    # splicing, used by extend/union and the rewrites -----------------------------

    def _anchored_slot(
        self, step: Step, artifact: str, chain: list[str], previous: str | None = None
    ) -> int:
        """Where ``step`` goes in ``chain`` given its own ordering edges.

        A name in the step's ``after`` / ``before`` that is no step at all is
        reported as such first: read as "no edge", it would surface as an
        ordering ambiguity, which hides the typo.
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
        raise AmbiguousOrderError(
            f"steps {step.name!r} and {chain[-1]!r} both update {artifact!r} with no order "
            f"between them; give {step.name!r} after= or before= one of: {', '.join(chain)}"
        )

    def splice(self, step: Step, index: int) -> Graph:
        """Insert ``step`` at declaration ``index`` and into its chains.

        In each chain the step goes next to a member it names in ``after`` /
        ``before``; failing that, where its declaration index puts it.
        """
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
    """Derive every edge of ``graph``; see the module docstring for the rules.

    ``edge(source, target, reason)`` makes each one; the checks pass a plain
    tuple, which is much cheaper than an :class:`Edge`.
    """
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
