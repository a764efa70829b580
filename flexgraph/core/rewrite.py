"""Rewrites: one edit of a graph, as data; a strategy is a list of them.

A rewrite refuses a step that does not exist, describes itself in one line,
and says what it did to which step, so a plan can say where each step came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import DuplicateStepError, Graph
from flexgraph.core.step import Step, run_step


class RewriteDefinitionError(FlexgraphError, ValueError):
    """A rewrite is malformed (a move with neither after nor before, a one-step fuse)."""


Touched = Mapping[str, str]
"""Step name -> what the rewrite did to it (inserted, moved, replaced, ...)."""


def _detach(graph: Graph, name: str) -> Graph:
    """Take ``name`` out of the steps and chains, leaving others' references."""
    steps = [s for s in graph.steps if s.name != name]
    chains = {a: tuple(n for n in c if n != name) for a, c in graph.chains.items()}
    return Graph(steps, chains, graph.inputs)


def _rename_references(graph: Graph, old: set[str], new: str) -> Graph:

    def renamed(names: tuple[str, ...], owner: str) -> tuple[str, ...]:
        out = []
        for n in names:
            n = new if n in old else n
            if n != owner and n not in out:
                out.append(n)
        return tuple(out)

    steps = [s.evolve(after=renamed(s.after, s.name), before=renamed(s.before, s.name))
             for s in graph.steps]
    return Graph(steps, graph.chains, graph.inputs)


def _substitute(graph: Graph, gone: set[str], new: Step, index: int) -> Graph:
    """Put ``new`` at declaration ``index`` in place of the steps ``gone``, chains included."""
    chains = {}
    for artifact, chain in graph.chains.items():
        members = [n for n in chain if n in gone]
        if members and artifact in new.updates:
            first = members[0]
            chain = tuple(
                new.name if n == first else n for n in chain if n == first or n not in gone
            )
        else:
            chain = tuple(n for n in chain if n not in gone)
        chains[artifact] = chain
    chained = {a for a, c in chains.items() if new.name in c}
    steps = [s for s in graph.steps if s.name not in gone]
    steps.insert(index, new.evolve(updates=tuple(a for a in new.updates if a in chained)))
    result = _rename_references(Graph(steps, chains, graph.inputs), gone, new.name)
    placed = result.by_name[new.name].evolve(updates=new.updates)
    if any(a not in chained for a in new.updates):
        return _detach(result, new.name).splice(placed, index)
    steps = list(result.steps)
    steps[index] = placed
    return Graph(steps, result.chains, result.inputs)


def _anchor(after: str | None, before: str | None, what: str) -> None:
    if after is None and before is None:
        raise RewriteDefinitionError(f"{what} needs after= or before=")
    if after is not None and before is not None:
        raise RewriteDefinitionError(f"{what} takes after= or before=, not both")


class Rewrite:
    """Base class of the rewrites: :meth:`apply`, :meth:`describe`, :attr:`touches`, ``why``.

    Examples
    --------
    >>> from flexgraph import Graph, Step
    >>> graph = Graph.of([Step("load", "m:load", provides="data"),
    ...                   Step("train", "m:train", requires="data")])
    >>> rewrite = Insert(Step("clean", "m:clean", updates="data"), after="load")
    >>> new, touched = rewrite.apply(graph)
    >>> new.names, touched
    (('load', 'clean', 'train'), {'clean': 'inserted'})
    """

    why: str = ""
    """What the rewrite is for, in words (plans show it beside the rewrite)."""

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        """``graph`` with this edit made (not yet validated), and the :data:`Touched` steps."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line saying what this rewrite does."""
        raise NotImplementedError

    @property
    def touches(self) -> tuple[str, ...]:
        """Names of the existing steps this rewrite refers to."""
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """The rewrite's keyword: ``insert``, ``move``, ..."""
        return type(self).__name__.lower()

    def __str__(self) -> str:
        return self.describe()


def _where(after: str | None, before: str | None) -> str:
    return f"after {after}" if after is not None else f"before {before}"


@attrs.frozen
class Insert(Rewrite):
    """Add ``step`` right after ``after`` or right before ``before`` (exactly one).

    Parameters
    ----------
    step : Step
    after, before : str, optional
    why : str, optional
        What the rewrite is for.
    """

    step: Step
    after: str | None = None
    before: str | None = None
    why: str = ""

    def __attrs_post_init__(self) -> None:
        _anchor(self.after, self.before, f"insert {self.step.name}")

    @property
    def touches(self) -> tuple[str, ...]:
        return tuple(n for n in (self.after, self.before) if n is not None)

    def describe(self) -> str:
        return f"insert {self.step.name} {_where(self.after, self.before)}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        for name in self.touches:
            graph.step(name, self.describe())
        if self.step.name in graph:
            raise DuplicateStepError(
                f"{self.describe()}: a step named {self.step.name!r} exists; use a Replace"
            )
        return _place(graph, self.step, self.after, self.before), {self.step.name: "inserted"}


def _place(graph: Graph, step: Step, after: str | None, before: str | None) -> Graph:
    if after is not None:
        step = step.evolve(after=tuple(dict.fromkeys(step.after + (after,))))
        index = graph.position[after] + 1
    else:
        step = step.evolve(before=tuple(dict.fromkeys(step.before + (before,))))
        index = graph.position[before]
    return graph.splice(step, index)


@attrs.frozen
class Remove(Rewrite):
    """Drop step ``name``; other steps' ordering references to it go too.

    Parameters
    ----------
    name : str
    why : str, optional
    """

    name: str
    why: str = ""

    @property
    def touches(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        return f"remove {self.name}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        graph.step(self.name, self.describe())
        return graph.remove(self.name), {self.name: "removed"}


@attrs.frozen
class Prune(Rewrite):
    """Drop step ``name``, which the run does not need, for ``reason`` (a few words).

    A derived rewrite: its reason is in the run's inputs, not the config.

    Parameters
    ----------
    name : str
    reason : str
    """

    name: str
    reason: str

    @property
    def why(self) -> str:  # type: ignore[override]
        return self.reason

    @property
    def touches(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        return f"prune {self.name} ({self.reason})"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        graph.step(self.name, self.describe())
        return graph.remove(self.name), {self.name: "pruned"}


@attrs.frozen
class Replace(Rewrite):
    """Put ``step`` in the place of step ``name``: its slot, chains and references.

    Parameters
    ----------
    name : str
    step : Step
    why : str, optional
    """

    name: str
    step: Step
    why: str = ""

    @property
    def touches(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        if self.step.name != self.name:
            return f"replace {self.name} with {self.step.name} ({self.step.fn_name})"
        return f"replace {self.name} with {self.step.fn_name}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        graph.step(self.name, self.describe())
        if self.step.name != self.name and self.step.name in graph:
            raise DuplicateStepError(f"{self.describe()}: a step named {self.step.name!r} exists")
        index = graph.position[self.name]
        return _substitute(graph, {self.name}, self.step, index), {self.step.name: "replaced"}


@attrs.frozen
class Move(Rewrite):
    """Move step ``name`` right after ``after`` or right before ``before`` (exactly one).

    Parameters
    ----------
    name : str
    after, before : str, optional
    why : str, optional
    """

    name: str
    after: str | None = None
    before: str | None = None
    why: str = ""

    def __attrs_post_init__(self) -> None:
        _anchor(self.after, self.before, f"move {self.name}")
        if self.name in (self.after, self.before):
            raise RewriteDefinitionError(f"move {self.name}: cannot move a step next to itself")

    @property
    def touches(self) -> tuple[str, ...]:
        return tuple(n for n in (self.name, self.after, self.before) if n is not None)

    def describe(self) -> str:
        return f"move {self.name} {_where(self.after, self.before)}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        for name in self.touches:
            graph.step(name, self.describe())
        moved = graph.step(self.name).evolve(after=(), before=())
        return _place(_detach(graph, self.name), moved, self.after, self.before), {
            self.name: "moved"
        }


@attrs.frozen
class FusedSteps:
    """The function of a fused step: runs ``members`` in order, returns ``outputs``.

    Parameters
    ----------
    members : tuple of Step
    outputs : tuple of str
    """

    members: tuple[Step, ...]
    outputs: tuple[str, ...]

    @property
    def flexgraph_ref(self) -> str:
        return "fused(" + ", ".join(s.fn_name for s in self.members) + ")"

    def __call__(self, **artifacts: Any) -> Any:
        context = dict(artifacts)
        for member in self.members:
            context.update(run_step(member, context))
        if len(self.outputs) == 1:
            return context[self.outputs[0]]
        return {a: context[a] for a in self.outputs}


def fused_step(name: str, members: Sequence[Step]) -> Step:
    """A step named ``name`` that runs ``members`` in order.

    Parameters
    ----------
    name : str
    members : sequence of Step

    Returns
    -------
    Step
        The members' interface, less what one provides to another.
    """
    member_names = {s.name for s in members}
    provides = tuple(dict.fromkeys(a for s in members for a in s.provides))
    updates = tuple(dict.fromkeys(a for s in members for a in s.updates if a not in provides))
    requires = tuple(
        dict.fromkeys(
            a for s in members for a in s.requires if a not in provides and a not in updates
        )
    )
    gives: dict[str, None] = {}
    ends: dict[str, None] = {}
    needs: dict[str, None] = {}
    for member in members:
        needs.update((f, None) for f in member.needs if f not in gives)
        for fact in member.ends:
            gives.pop(fact, None)
            ends[fact] = None
        for fact in member.gives:
            ends.pop(fact, None)
            gives[fact] = None
    return Step(
        name=name,
        fn=FusedSteps(tuple(members), provides + updates),
        gives=tuple(gives),
        ends=tuple(ends),
        needs=tuple(needs),
        requires=requires,
        provides=provides,
        updates=updates,
        after=tuple(dict.fromkeys(a for s in members for a in s.after if a not in member_names)),
        before=tuple(dict.fromkeys(b for s in members for b in s.before if b not in member_names)),
        doc="runs " + ", ".join(s.name for s in members),
    )


@attrs.frozen
class Fuse(Rewrite):
    """Replace steps ``names`` (at least two) by one, at the place of the earliest.

    Parameters
    ----------
    names : sequence of str
    into : Step or str
        The step that does their work, or the name of a :func:`fused_step` of them.
    why : str, optional
    """

    names: tuple[str, ...] = attrs.field(converter=tuple)
    into: Step | str = attrs.field()
    why: str = ""

    def __attrs_post_init__(self) -> None:
        if len(self.names) < 2:
            raise RewriteDefinitionError("fuse needs at least two steps")

    @property
    def touches(self) -> tuple[str, ...]:
        return self.names

    @property
    def fused_name(self) -> str:
        """The name of the step the members become."""
        return self.into if isinstance(self.into, str) else self.into.name

    def describe(self) -> str:
        return f"fuse {', '.join(self.names)} into {self.fused_name}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        members = [graph.step(n, self.describe()) for n in self.names]
        members.sort(key=lambda s: graph.position[s.name])
        gone = {s.name for s in members}
        fused = self.into if isinstance(self.into, Step) else fused_step(self.into, members)
        if fused.name in graph and fused.name not in gone:
            raise DuplicateStepError(f"{self.describe()}: a step named {fused.name!r} exists")
        index = graph.position[members[0].name]
        return _substitute(graph, gone, fused, index), {fused.name: "fused"}


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, a long mapping or sequence cut to its outline."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: ..." for k in value) + "}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} items]"
    return text


@attrs.frozen
class Configure(Rewrite):
    """Bind ``params`` to step ``name``'s function, over the ones it has.

    Params that change what the step does to the model say so in ``gives`` /
    ``ends``: facts are never guessed from params.

    Parameters
    ----------
    name : str
    params : mapping
    gives, ends : tuple of str, optional
        Facts the configured step now gives, or ends, instead of its own.
    why : str, optional
    contracts, expects : tuple of str, optional
        Checks added to the step's own.
    """

    name: str
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    gives: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    ends: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    why: str = ""
    contracts: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    expects: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def touches(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        bound = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        checks = ", ".join(ref.rpartition(":")[2] for ref in self.expects + self.contracts)
        return f"configure {self.name}: {bound or f'checks {checks}'}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        step = graph.step(self.name, self.describe())
        gives = [f for f in step.gives if f not in self.ends] + [
            f for f in self.gives if f not in step.gives]
        ends = [f for f in step.ends if f not in self.gives] + [
            f for f in self.ends if f not in step.ends]
        configured = step.evolve(params={**step.params, **self.params}, gives=gives, ends=ends,
                                 contracts=step.contracts + self.contracts,
                                 expects=step.expects + self.expects)
        steps = [configured if s.name == self.name else s for s in graph.steps]
        return Graph(steps, graph.chains, graph.inputs), {self.name: "configured"}


@attrs.frozen
class IfPresent(Rewrite):
    """``rewrite``, applied only when the optional step ``step`` is in the graph.

    Parameters
    ----------
    step : str
    rewrite : Rewrite
    why : str, optional
        By default ``rewrite``'s.
    """

    step: str
    rewrite: Rewrite
    why: str = attrs.field(default=attrs.Factory(lambda self: self.rewrite.why,
                                                 takes_self=True))

    @property
    def touches(self) -> tuple[str, ...]:
        return self.rewrite.touches

    def holds(self, graph: Graph) -> bool:
        """Whether ``graph`` meets the condition, so that ``rewrite`` applies."""
        return self.step in graph

    @property
    def kind(self) -> str:
        return self.rewrite.kind

    def describe(self) -> str:
        return f"{self.rewrite.describe()}, when {self.step} is planned"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        if self.holds(graph):
            return self.rewrite.apply(graph)
        return graph, {}


@attrs.frozen
class IfAbsent(IfPresent):
    """``rewrite``, applied only when the optional step ``step`` is *not* in the graph.

    Parameters
    ----------
    step : str
    rewrite : Rewrite
    why : str, optional
        By default ``rewrite``'s.
    """

    def describe(self) -> str:
        return f"{self.rewrite.describe()}, when {self.step} is not planned"

    def holds(self, graph: Graph) -> bool:
        return self.step not in graph


REWRITE_KINDS: Mapping[str, type[Rewrite]] = {
    "insert": Insert,
    "remove": Remove,
    "replace": Replace,
    "move": Move,
    "fuse": Fuse,
    "configure": Configure,
}
"""The rewrite kinds by the keyword that names them in specs."""
