"""Rewrites: one edit of a graph, as data.

A strategy is a list of these. Each rewrite names the steps it touches, refuses
to touch one that does not exist (with a did-you-mean), says in one line what it
does (:meth:`Rewrite.describe`), and returns the new graph together with what it
did to which step, so that a plan can say where each step came from.

The rewrites keep the updater chains of :mod:`flexgraph.core.graph` ordered:
``Move`` splices a step out of its chains (its neighbours are re-linked) and in
at its new place, and replaces its own ordering edges with the new anchor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import DuplicateStepError, Graph
from flexgraph.core.step import Step, run_step


class RewriteDefinitionError(FlexgraphError, ValueError):
    """A rewrite is malformed (e.g. a move with neither after nor before).

    Raised when the rewrite is made, before any graph is seen: an ``Insert``
    or ``Move`` with neither or both of ``after`` / ``before``, a ``Move`` of a
    step next to itself, a ``Fuse`` of fewer than two steps.
    """


Touched = Mapping[str, str]
"""Step name -> what the rewrite did to it: inserted, moved, replaced, ..."""


def _detach(graph: Graph, name: str) -> Graph:
    """Take ``name`` out of the steps and chains, leaving others' references."""
    steps = [s for s in graph.steps if s.name != name]
    chains = {a: tuple(n for n in c if n != name) for a, c in graph.chains.items()}
    return Graph(steps, chains, graph.inputs)


def _rename_references(graph: Graph, old: set[str], new: str) -> Graph:
    """Point other steps' ``after`` / ``before`` at ``new`` instead of ``old``."""

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
    """Put ``new`` at declaration ``index`` in place of the steps ``gone``.

    In each chain that held one of ``gone``, ``new`` takes the place of the
    first of them if it updates that artifact; artifacts only ``new`` updates
    are spliced in as an insert would.
    """
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
    """Base class of the rewrites: one edit of a graph, as data.

    A subclass defines :meth:`apply`, :meth:`describe` and :attr:`touches`;
    ``str(rewrite)`` is its description. Rewrites are values: applying one
    returns a new graph and leaves the old one as it was.

    Examples
    --------
    >>> from flexgraph import Graph, Step
    >>> graph = Graph.of([Step("load", "m:load", provides="data"),
    ...                   Step("train", "m:train", requires="data")])
    >>> rewrite = Insert(Step("clean", "m:clean", updates="data"), after="load")
    >>> print(rewrite)
    insert clean after load
    >>> new, touched = rewrite.apply(graph)
    >>> new.names, touched
    (('load', 'clean', 'train'), {'clean': 'inserted'})
    """

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        """Return ``graph`` with this edit made, and what it did to which step.

        Parameters
        ----------
        graph : Graph

        Returns
        -------
        graph : Graph
            The new graph. It is not validated here: :func:`flexgraph.make_plan`
            validates it before the next rewrite.
        touched : mapping of str to str
            Step name -> what the rewrite did to it (``"inserted"``,
            ``"moved"``, ``"replaced"``, ``"fused"``, ``"configured"``,
            ``"removed"``); plans record it as the step's origin.

        Raises
        ------
        UnknownStepError
            The rewrite names a step the graph does not have; the message
            starts with the rewrite's description and suggests close names.
        DuplicateStepError
            The rewrite would add a step under a name the graph already has.
        """
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
        """``insert``, ``remove``, ``replace``, ``move``, ``fuse`` or ``configure``."""
        return type(self).__name__.lower()

    def __str__(self) -> str:
        return self.describe()


def _where(after: str | None, before: str | None) -> str:
    return f"after {after}" if after is not None else f"before {before}"


@attrs.frozen
class Insert(Rewrite):
    """Add ``step`` right after ``after`` (or right before ``before``).

    The anchor becomes one of the step's own ordering edges, and the step takes
    the declaration slot next to it; a step that updates an artifact joins that
    artifact's updater chain next to the anchor.

    Parameters
    ----------
    step : Step
        The new step.
    after, before : str, optional
        The step it goes next to; exactly one of them.

    Raises
    ------
    RewriteDefinitionError
        Neither or both of ``after`` / ``before`` are given.
    """

    step: Step
    after: str | None = None
    before: str | None = None

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
    """Drop a step; other steps' ordering references to it go too.

    Parameters
    ----------
    name : str
        The step to drop. Whatever needed what it provided must get it
        elsewhere, or the plan is refused with a :class:`~flexgraph.MissingInputError`.
    """

    name: str

    @property
    def touches(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        return f"remove {self.name}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        graph.step(self.name, self.describe())
        return graph.remove(self.name), {self.name: "removed"}


@attrs.frozen
class Replace(Rewrite):
    """Swap a step for another in place.

    The new step takes the old one's declaration slot, its place in every chain
    it still updates, and the ordering references other steps make to it.

    Parameters
    ----------
    name : str
        The step to replace.
    step : Step
        Its replacement, under the same name or a new one.
    """

    name: str
    step: Step

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
    """Move a step right after ``after`` (or right before ``before``).

    The step is spliced out of its chains and in at the new place; its own
    ``after`` / ``before`` are replaced by the new anchor.

    Parameters
    ----------
    name : str
        The step to move.
    after, before : str, optional
        The step it goes next to; exactly one of them.

    Raises
    ------
    RewriteDefinitionError
        Neither or both of ``after`` / ``before`` are given, or the anchor is
        the step itself.
    """

    name: str
    after: str | None = None
    before: str | None = None

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
    """The function of a fused step: runs the member steps in order.

    Called with the fused step's inputs, it returns what the step contract asks
    of a step with these ``outputs``: the value itself for one output, a mapping
    for several.

    Parameters
    ----------
    members : tuple of Step
        The steps fused, in the order they run.
    outputs : tuple of str
        The fused step's outputs (what it provides, then what it updates).
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
    """A step that runs ``members`` in order, with their combined interface.

    Artifacts one member provides and a later one reads stay inside.

    Parameters
    ----------
    name : str
        The fused step's name.
    members : sequence of Step
        The steps to run, in order.

    Returns
    -------
    Step
        One step requiring, providing and updating what the members do together,
        ordered after and before what they are (outside the group).
    """
    member_names = {s.name for s in members}
    provides = tuple(dict.fromkeys(a for s in members for a in s.provides))
    updates = tuple(dict.fromkeys(a for s in members for a in s.updates if a not in provides))
    requires = tuple(
        dict.fromkeys(
            a for s in members for a in s.requires if a not in provides and a not in updates
        )
    )
    return Step(
        name=name,
        fn=FusedSteps(tuple(members), provides + updates),
        requires=requires,
        provides=provides,
        updates=updates,
        after=tuple(dict.fromkeys(a for s in members for a in s.after if a not in member_names)),
        before=tuple(dict.fromkeys(b for s in members for b in s.before if b not in member_names)),
        doc="runs " + ", ".join(s.name for s in members),
    )


@attrs.frozen
class Fuse(Rewrite):
    """Replace several steps by one, at the place of the earliest of them.

    ``into`` is either a :class:`Step` (e.g. ``deepspeed_initialize``, which does
    the work of ``wrap_model`` and ``build_optim_wrapper`` in one call) or a
    name, in which case the fused step runs the members in order.

    Parameters
    ----------
    names : sequence of str
        The steps to fuse, at least two.
    into : Step or str
        The step that does their work, or the name of one that runs them in
        declaration order; artifacts one member provides and a later one reads
        stay inside it.

    Raises
    ------
    RewriteDefinitionError
        Fewer than two steps are named.

    Examples
    --------
    >>> from flexgraph import Graph, Step
    >>> graph = Graph.of([Step("wrap", "m:wrap", updates="model"),
    ...                   Step("optim", "m:optim", requires="model", provides="opt")],
    ...                  inputs=["model"])
    >>> fused, touched = Fuse(["wrap", "optim"], "wrap_and_optim").apply(graph)
    >>> fused.names, touched
    (('wrap_and_optim',), {'wrap_and_optim': 'fused'})
    >>> step = fused.by_name["wrap_and_optim"]
    >>> step.updates, step.provides, step.fn_name
    (('model',), ('opt',), 'fused(m:wrap, m:optim)')
    """

    names: tuple[str, ...] = attrs.field(converter=tuple)
    into: Step | str = attrs.field()

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
    """``repr(value)``, with a long mapping or sequence shown as its outline.

    Names and numbers are never cut.

    A description is one line; the full values are in the plan's step params
    (``--format json``, ``--explain``).
    """
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
    """Bind parameters of a step (merged over the ones it has).

    Parameters
    ----------
    name : str
        The step to configure.
    params : mapping
        Keyword arguments for its function; each replaces a bound one of the
        same name. The step's place in the graph does not change.

    Examples
    --------
    >>> print(Configure("build_model", {"device": "meta"}))
    configure build_model: device='meta'
    """

    name: str
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)

    @property
    def touches(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        bound = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        return f"configure {self.name}: {bound}"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        step = graph.step(self.name, self.describe())
        configured = step.evolve(params={**step.params, **self.params})
        steps = [configured if s.name == self.name else s for s in graph.steps]
        return Graph(steps, graph.chains, graph.inputs), {self.name: "configured"}


@attrs.frozen
class IfPresent(Rewrite):
    """``rewrite``, applied only when the optional step ``step`` is in the graph.

    For orders a strategy needs only when an optional step was asked for (FSDP
    compiles before sharding, when the config compiles at all). Everywhere else
    a rewrite naming an absent step is refused; this says so explicitly, and
    the other steps ``rewrite`` names must still exist.

    Parameters
    ----------
    step : str
        The optional step.
    rewrite : Rewrite
        Applied when ``step`` is in the graph; otherwise the graph is left as
        it is and no step is touched.
    """

    step: str
    rewrite: Rewrite

    @property
    def touches(self) -> tuple[str, ...]:
        return self.rewrite.touches

    @property
    def kind(self) -> str:
        return self.rewrite.kind

    def describe(self) -> str:
        return f"{self.rewrite.describe()}, when {self.step} is planned"

    def apply(self, graph: Graph) -> tuple[Graph, Touched]:
        if self.step in graph:
            return self.rewrite.apply(graph)
        return graph, {}


REWRITE_KINDS: Mapping[str, type[Rewrite]] = {
    "insert": Insert,
    "remove": Remove,
    "replace": Replace,
    "move": Move,
    "fuse": Fuse,
    "configure": Configure,
}
"""The rewrite kinds by the keyword that names them in specs."""
