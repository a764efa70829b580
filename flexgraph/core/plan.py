"""Plans: a strategy applied to a graph, validated after each rewrite, ordered, and attributed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import attrs
import networkx as nx

from flexgraph.core.checks import Check, Precedes, verify_checks
from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import CycleError, Edge, Graph
from flexgraph.core.rewrite import Fuse, IfAbsent, IfPresent, Insert, Replace, Rewrite
from flexgraph.core.states import (
    Placer,
    changes_model,
    implied_needs,
    model_line,
    model_states,
    reads_model,
    slot_of,
    where_it_runs,
)
from flexgraph.core.step import Step
from flexgraph.core.strategy import Strategy
from flexgraph.core.validate import check, validate


@attrs.frozen
class Origin:
    """Where a step's place in the plan comes from; ``str()`` gives it in words."""

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
        """``"base"``, ``"replaced by ddp #2"`` or ``"placed by need"`` (for narrow columns)."""
        if self.action == "base":
            return "base"
        if self.index is None:
            return f"{self.action} by {self.strategy}"
        return f"{self.action} by {self.strategy} #{self.index + 1}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return attrs.asdict(self)


BASE = Origin()

NEED = "need"
"""The strategy name of a placement by need (``placed by need``)."""


@attrs.frozen
class AppliedRewrite:
    """One rewrite as applied (or skipped): its position, text, reason and what it did."""

    index: int
    strategy: str
    description: str
    kind: str
    touched: Mapping[str, str]
    consumed: Mapping[str, str | None] = attrs.field(factory=dict)
    """Steps this rewrite took out -> the step in their place (None if removed)."""
    why: str = ""
    """Its reason: its own ``why``, else the texts of the checks that keep its order."""
    skipped: str | None = None
    """Why a conditional rewrite did not apply (``None``: it applied)."""
    steps: tuple[str, ...] = ()
    """The steps it names or brings in, applied or not."""

    @property
    def applied(self) -> bool:
        """Whether it applied (a skipped conditional keeps its number)."""
        return self.skipped is None


def _order(graph: Graph, dag: nx.DiGraph) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    key = graph.position.__getitem__
    order = tuple(nx.lexicographical_topological_sort(dag, key=key))
    stages = tuple(tuple(sorted(gen, key=key)) for gen in nx.topological_generations(dag))
    return order, stages


@attrs.frozen
class Plan:
    """The result of applying a strategy to a graph; see :func:`make_plan`."""

    base: Graph
    graph: Graph
    strategy: str | None
    order: tuple[str, ...]
    stages: tuple[tuple[str, ...], ...]
    base_order: tuple[str, ...]
    rewrites: tuple[AppliedRewrite, ...]
    history: Mapping[str, tuple[Origin, ...]]
    edges: tuple[Edge, ...]
    states: Mapping[str, tuple[str, ...] | None] = attrs.field(factory=dict)
    implied: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps in execution order."""
        return tuple(self.graph.by_name[n] for n in self.order)

    def origin(self, name: str) -> Origin:
        """The last rewrite that placed or changed step ``name``, or ``BASE``."""
        self.graph.step(name)
        history = self.history.get(name, ())
        return history[-1] if history else BASE

    def why(self, origin: Origin) -> str:
        """The reason of the rewrite behind ``origin`` (``""``: none, or a placement)."""
        return next((r.why for r in self.rewrites
                     if (r.strategy, r.index) == (origin.strategy, origin.index)), "")

    def explain(self, name: str) -> str:
        """Why ``name`` sits where it does, in lines (``--explain``)."""
        step = self.graph.step(name)
        position = self.order.index(name)
        lines = [f"{name} is step {position + 1} of {len(self.order)} ({step.fn_name})"]
        history = self.history.get(name, ())
        if step.user:
            lines.append(f"  the user's step ({step.user})")
        for origin in history:
            lines.append(f"  {origin}")
            if self.why(origin):
                lines.append(f"    why: {self.why(origin)}")
        if not history and not step.user:
            lines.append("  declared by the base graph, untouched by the strategy")
        for skipped in self.rewrites:
            if skipped.skipped is not None and name in skipped.steps:
                lines.append(f"  skipped {skipped.strategy} #{skipped.index + 1}: "
                             f"{skipped.description} ({skipped.skipped})")
        needs = step.needs or self.implied.get(name, ())
        if needs:
            said = "declared" if step.needs else "what its anchors mean in the base graph"
            lines.append(f"  needs of the model: {', '.join(sorted(needs))} ({said})")
        if changes_model(step) and self.states.get(name):
            lines.append(f"  the model after it: {', '.join(self.states[name])}")
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

Records = list[tuple[AppliedRewrite, Rewrite]]


def _named(rewrite: Rewrite) -> set[str]:
    names = set(rewrite.touches)
    while isinstance(rewrite, IfPresent):
        names.add(rewrite.step)
        rewrite = rewrite.rewrite
    if isinstance(rewrite, (Insert, Replace)):
        names.add(rewrite.step.name)
    elif isinstance(rewrite, Fuse):
        names.add(rewrite.fused_name)
    return names


def _reason(rewrite: Rewrite, checks: tuple[Check, ...]) -> str:
    """``rewrite``'s own ``why``, else the reasons of the strategy's orders it makes."""
    if rewrite.why:
        return rewrite.why
    names = _named(rewrite)
    return "; ".join(c.why for c in checks
                     if isinstance(c, Precedes) and {c.first, c.then} <= names)


def _skip_reason(rewrite: IfPresent, records: Records) -> str:
    """Why a conditional rewrite does not apply: whether its step is planned, and why not."""
    if isinstance(rewrite, IfAbsent):
        return f"{rewrite.step} is planned"
    cause = next((r for r, _ in reversed(records) if rewrite.step in r.consumed), None)
    if cause is None:
        return f"{rewrite.step} is not planned"
    return (f"{rewrite.step} is not planned (taken out by {cause.strategy} "
            f"#{cause.index + 1}: {cause.description})")


def _apply_all(rewrites: tuple[Rewrite, ...], owner: str, where: str, current: Graph,
               records: Records, history: dict[str, list[Origin]],
               checks: tuple[Check, ...] = ()) -> Graph:
    """Apply ``rewrites``, validating after each; ``where`` starts an error's message."""
    shape = _shape(current)
    for index, rewrite in enumerate(rewrites):
        before = current
        skipped = None
        if isinstance(rewrite, IfPresent) and not rewrite.holds(current):
            skipped = _skip_reason(rewrite, records)
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
        record = AppliedRewrite(
            index=index,
            strategy=owner,
            description=rewrite.describe(),
            kind=rewrite.kind,
            touched=MappingProxyType(dict(touched)),
            consumed=MappingProxyType(_consumed(before, current, touched)),
            why=_reason(rewrite, checks),
            skipped=skipped,
            steps=tuple(sorted(_named(rewrite))),
        )
        records.append((record, rewrite))
        for name, action in touched.items():
            origin = Origin(action, owner, index, rewrite.describe())
            history.setdefault(name, []).append(origin)
    return current


def _refuse_contradiction(graph: Graph, strategy: Strategy | None,
                          derived: Sequence[Rewrite]) -> None:
    """Raise the :class:`PlacementError` of a user's step whose anchors make ``graph`` cyclic."""
    placer = Placer(None, graph)
    for step in graph.steps:
        if not step.user or not (step.after and step.before):
            continue
        rest = graph.remove(step.name)
        try:
            check(rest)
        except FlexgraphError:
            continue

        def fits(variant: Step, rest: Graph = rest) -> str | None:
            try:
                plan = make_plan(rest.extend([variant]), strategy, derived=derived)
            except FlexgraphError:
                return None
            return where_it_runs(plan.graph, variant.name)

        refusal = placer.contradiction(rest, step, fits)
        if refusal is not None:
            raise refusal


References = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def _hold_out(graph: Graph, names: list[str]) -> tuple[Graph, References]:
    """``graph`` without ``names``, and the other steps' references to them."""
    held = set(names)
    refs = {s.name: (tuple(a for a in s.after if a in held),
                     tuple(b for b in s.before if b in held))
            for s in graph.steps if s.name not in held and held & set(s.after + s.before)}
    if names:
        return graph.remove(*names), refs
    return (attrs.evolve(graph, pending=()) if graph.pending else graph), refs


def _restore(graph: Graph, refs: References) -> Graph:
    if not refs:
        return graph
    steps = []
    for s in graph.steps:
        after, before = refs.get(s.name, ((), ()))
        steps.append(s.evolve(after=tuple(dict.fromkeys(s.after + after)),
                              before=tuple(dict.fromkeys(s.before + before))))
    restored = Graph(steps, graph.chains, graph.inputs)
    check(restored)
    return restored


def _check_needs(graph: Graph, placer: Placer, placed: set[str]) -> None:
    """Refuse a step (not placed by its needs) whose declared needs do not hold where it is."""
    line = model_line(graph)
    for step in graph.steps:
        if step.needs and step.name not in placed:
            state = line[slot_of(graph, step)].state
            if not set(step.needs) <= state:
                raise placer.unmet(graph, step)


def make_plan(
    graph: Graph, strategy: Strategy | None = None, *, targets: tuple[str, ...] = (),
    derived: Sequence[Rewrite] = (),
) -> Plan:
    """Validate ``graph``, apply ``strategy`` rewrite by rewrite, place the user's steps, order it.

    A step that needs something of the model is held out of the rewrites and
    placed after them, where its needs hold, or refused.

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
    try:
        base_dag = validate(graph)
    except CycleError:
        _refuse_contradiction(graph, strategy, derived)
        raise
    base_order, _ = _order(graph, base_dag)
    records: Records = []
    history: dict[str, list[Origin]] = {}
    current = _apply_all(tuple(derived), DERIVED, "derived rewrite", graph, records, history)
    rewrites = strategy.rewrites if strategy is not None else ()
    touched = {n for r in rewrites for n in _named(r)}
    implied = {s.name: implied_needs(current, s) for s in current.steps if s.user}
    held = [s for s in current.steps if reads_model(s) and (s.needs or implied.get(s.name))
            and s.name not in touched]
    current, refs = _hold_out(current, [s.name for s in held])
    if strategy is not None:
        current = _apply_all(rewrites, strategy.name, f"strategy {strategy.name!r}, rewrite",
                             current, records, history, strategy.checks)
    placer = Placer(strategy.name if strategy else None, graph, implied, tuple(records))
    for step in [*(graph.by_name[s.name] for s in held), *graph.pending]:
        current, placement = placer.place(current, step)
        if placement is not None:
            history.setdefault(step.name, []).append(Origin("placed", NEED, None, placement))
    current = _restore(current, refs)
    _check_needs(current, placer, {s.name for s in held} | {s.name for s in graph.pending})
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
        rewrites=tuple(record for record, _ in records),
        history=MappingProxyType(
            {n: tuple(h) for n, h in history.items() if n in current}
        ),
        edges=edges,
        states=MappingProxyType(model_states(current, order)),
        implied=MappingProxyType({n: implied[n] for n in order if implied.get(n)}),
    )
