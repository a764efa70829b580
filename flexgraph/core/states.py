"""Model states and needs: the model after each step, and where a step that needs something goes.

The model's state after a step is the set of facts (:attr:`Step.gives`,
:attr:`Step.ends`) that hold along its *line*: its producer, then its updaters
in chain order. A user's step anchored on the base graph's model line needs
what the base graph's model has there (its :data:`ANCHOR_FACTS`), so its
anchors keep their meaning under every strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import attrs
import networkx as nx

from flexgraph.core.errors import did_you_mean
from flexgraph.core.graph import CycleError, Graph, GraphError, UnknownStepError
from flexgraph.core.rewrite import Configure, Fuse, IfPresent, Insert, Replace, Rewrite
from flexgraph.core.step import MODEL, Step
from flexgraph.core.validate import check

ANCHOR_FACTS = frozenset({"whole", "initialised", "loaded", "unwrapped"})
"""The facts a user's name anchors imply: what the model is, not how it is held."""

FACTS = {
    "whole": "every rank holds every parameter's full value",
    "unwrapped": "the user's module itself, in no distribution wrapper",
    "initialised": "the weights hold their init values on every rank",
    "loaded": "load_from is applied",
    "sharded": "FSDP2 / HSDP shards",
    "partitioned": "ZeRO-3 partitions",
    "in_engine": "inside DeepSpeed's engine (it owns the optimizer and the precision)",
    "on_device": "the parameters have storage on env.device",
    "compiled": "torch.compile is applied",
}
"""The facts the standard graph and the built-in strategies declare, each in plain words."""


class PlacementError(GraphError):
    """A step's needs hold nowhere in the plan, or its anchors contradict the plan's order."""


class Record(Protocol):
    """An applied rewrite as :class:`~flexgraph.core.plan.AppliedRewrite` records it."""

    index: int
    strategy: str
    description: str
    why: str
    touched: Mapping[str, str]
    consumed: Mapping[str, str | None]


@attrs.frozen
class Point:
    """A point of the model's line: after step ``name`` (``None``: before any), in ``state``."""

    name: str | None
    state: frozenset[str]


def changes_model(step: Step) -> bool:
    """Whether ``step`` makes or changes the model (its facts then apply)."""
    return MODEL in step.provides or MODEL in step.updates


def reads_model(step: Step) -> bool:
    """Whether ``step`` receives the model."""
    return MODEL in step.requires or MODEL in step.updates


def _after(state: frozenset[str], step: Step) -> frozenset[str]:
    return (state - set(step.ends)) | set(step.gives)


def model_line(graph: Graph) -> list[Point]:
    """The model's producer, then its updaters in order, each with the state after it."""
    producer = graph.producers.get(MODEL)
    state: frozenset[str] = frozenset()
    if producer is not None:
        state = _after(state, graph.by_name[producer])
    points = [Point(producer, state)]
    for name in graph.chains.get(MODEL, ()):
        state = _after(state, graph.by_name[name])
        points.append(Point(name, state))
    return points


def model_states(graph: Graph, order: Iterable[str]) -> dict[str, tuple[str, ...] | None]:
    """The model's facts after each step of ``order`` (``None`` before the model exists)."""
    state: frozenset[str] | None = frozenset() if MODEL in graph.inputs else None
    states: dict[str, tuple[str, ...] | None] = {}
    for name in order:
        step = graph.by_name[name]
        if changes_model(step):
            state = _after(state or frozenset(), step)
        states[name] = None if state is None else tuple(sorted(state))
    return states


def slot_of(graph: Graph, step: Step) -> int:
    """The index of the point of the line whose model ``step`` (in ``graph``) receives."""
    chain = graph.chains.get(MODEL, ())
    if step.name in chain:
        return chain.index(step.name)
    ahead = [i for i, n in enumerate(chain)
             if n in step.before or step.name in graph.by_name[n].after]
    return min(ahead) if ahead else len(chain)


def implied_needs(graph: Graph, step: Step) -> tuple[str, ...]:
    """What ``step``'s name anchors mean in ``graph`` (the base), or ``()``."""
    if not step.user or step.needs or step.gives or step.ends or not reads_model(step):
        return ()
    line = model_line(graph)
    anchors = step.after + step.before
    on_line = {p.name for p in line} - {step.name, None}
    if not any(a in on_line for a in anchors) or any(a not in graph for a in anchors):
        return ()
    return tuple(sorted(line[slot_of(graph, step)].state & ANCHOR_FACTS))


def _facts(facts: Iterable[str]) -> str:
    return ", ".join(sorted(facts))


def _anchors(step: Step) -> str:
    return ", ".join([f"after={a!r}" for a in step.after] + [f"before={b!r}" for b in step.before])


def _where(line: Sequence[Point], slot: int) -> str:
    here = f"after {line[slot].name}" if line[slot].name else "first"
    return here + (f", before {line[slot + 1].name}" if slot + 1 < len(line) else "")


def _declares_end(rewrite: Rewrite, fact: str) -> bool:
    while isinstance(rewrite, IfPresent):
        rewrite = rewrite.rewrite
    if isinstance(rewrite, Configure):
        return fact in rewrite.ends
    if isinstance(rewrite, (Insert, Replace)):
        return fact in rewrite.step.ends
    into = rewrite.into if isinstance(rewrite, Fuse) else None
    return isinstance(into, Step) and fact in into.ends


@attrs.frozen
class Placer:
    """Places steps by their anchors and needs into a rewritten graph (see the module docstring)."""

    strategy: str | None
    base: Graph
    implied: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    records: Sequence[tuple[Record, Rewrite]] = ()

    def needs_of(self, step: Step) -> tuple[tuple[str, ...], bool]:
        """``step``'s needs, and whether its anchors imply them (rather than declared)."""
        if step.needs:
            return step.needs, False
        if self.base.by_name.get(step.name) == step:
            return self.implied.get(step.name, ()), True
        try:  # a variant of a user's step: its anchors in the base graph
            graph = self.base.remove(step.name) if step.name in self.base else attrs.evolve(
                self.base, pending=())
            if any(a not in graph for a in step.after + step.before):
                return (), True
            return implied_needs(graph | Graph.of([step]), step), True
        except GraphError:
            return (), True

    def place(self, graph: Graph, step: Step) -> tuple[Graph, str | None]:
        """``graph`` with ``step`` placed, and how, when not at its anchors; or refuse."""
        found = self._place(graph, step, explain=True)
        assert found is not None  # explain=True raises instead
        return found

    def fits(self, graph: Graph, step: Step) -> str | None:
        """Where ``step`` would run in ``graph`` (``"after x, before y"``), or ``None``."""
        try:
            found = self._place(graph, step, explain=False)
        except GraphError:
            return None
        return None if found is None else where_it_runs(found[0], step.name)

    def _place(self, graph: Graph, asked: Step, explain: bool) -> tuple[Graph, str | None] | None:
        needs, implied = self.needs_of(asked)
        step = self._translated(graph, asked)
        unknown = [a for a in step.after + step.before if a not in graph]
        if unknown:
            if not explain:
                return None
            raise self._unknown(graph, asked, step, unknown[0])
        literal, cycle = self._splice(graph, step)
        if literal is not None and set(needs) <= _received(literal, step.name):
            return literal, None
        line = model_line(graph)
        target = self._target(line, step, literal)
        if needs:
            for slot in sorted(range(len(line)), key=lambda i: (_distance(i, target), i)):
                if set(needs) <= line[slot].state:
                    placed, _ = self._splice(graph, self._at(line, step, slot))
                    if placed is not None:
                        return placed, self._placement(graph, line, step, needs, slot, literal)
        if not explain:
            return None
        if needs and not any(set(needs) <= p.state for p in line):
            raise self._refuse_needs(graph, asked, needs, implied, line, target)
        raise self._contradiction(graph, asked, step, cycle)

    def _splice(self, graph: Graph, step: Step) -> tuple[Graph | None, CycleError | None]:
        """``graph`` with ``step`` appended at its anchors, or ``None`` and the cycle it makes."""
        placed = graph | Graph.of([step])
        try:
            check(placed)
        except CycleError as exc:
            return None, exc
        return placed, None

    def _translated(self, graph: Graph, step: Step) -> Step:
        """``step`` with anchors the rewrites took out renamed to what took their place.

        An anchor removed for good stands for its neighbour on the base model line.
        """
        gone: dict[str, str | None] = {}
        for record, _ in self.records:
            gone.update(record.consumed)
        line = [p.name for p in model_line(self.base)]

        def resolve(name: str | None, step_by: int) -> str | None:
            seen = set()
            while name is not None and name not in graph and name in gone and name not in seen:
                seen.add(name)
                into = gone[name]
                if into is None and name in line:
                    at = line.index(name) + step_by
                    into = line[at] if 0 <= at < len(line) else None
                name = into
            return name

        def renamed(names: tuple[str, ...], step_by: int) -> tuple[str, ...]:
            found = (resolve(n, step_by) for n in names)
            return tuple(dict.fromkeys(n for n in found if n is not None and n != step.name))

        after, before = renamed(step.after, -1), renamed(step.before, +1)
        if (after, before) == (step.after, step.before):
            return step
        return step.evolve(after=after, before=before)

    @staticmethod
    def _target(line: Sequence[Point], step: Step, literal: Graph | None) -> tuple[int, int]:
        """The slots ``step``'s anchors point at on ``line``: ``(low, high)``."""
        index = {p.name: i for i, p in enumerate(line) if p.name is not None}
        lows = [index[a] for a in step.after if a in index]
        highs = [max(index[b] - 1, 0) for b in step.before if b in index]
        if not lows and not highs:
            at = slot_of(literal, literal.by_name[step.name]) if literal else len(line) - 1
            return at, at
        low = max(lows) if lows else min(highs)
        high = min(highs) if highs else low
        return min(low, high), max(low, high)

    @staticmethod
    def _at(line: Sequence[Point], step: Step, slot: int) -> Step:
        """``step`` anchored at ``slot`` of ``line``, its other anchors kept."""
        on_line = {p.name for p in line}
        after = tuple(a for a in step.after if a not in on_line)
        before = tuple(b for b in step.before if b not in on_line)
        if line[slot].name is not None:
            after += (line[slot].name,)
        if slot + 1 < len(line):
            before += (line[slot + 1].name,)  # type: ignore[operator]
        return step.evolve(after=after, before=before)

    def _under(self) -> str:
        return f"under {self.strategy!r}" if self.strategy else "in the base graph"

    def _prefix(self, step: Step) -> str:
        where = f"strategy {self.strategy!r}: " if self.strategy else ""
        return where + (f"{step.user}: " if step.user else "") + f"step {step.name!r}"

    def _rewrite(self, name: str, fact: str | None = None, consumed: bool = False) -> str:
        """`` (fsdp #2: configure build_model: ...: why)``: the rewrite that did it, or ``''``."""
        touching = [(r, w) for r, w in self.records
                    if (name in r.consumed if consumed else name in r.touched)]
        chosen = next((r for r, w in reversed(touching) if fact and _declares_end(w, fact)),
                      touching[-1][0] if touching else None)
        if chosen is None:
            return ""
        why = f": {chosen.why}" if chosen.why else ""
        return f" ({chosen.strategy} #{chosen.index + 1}: {chosen.description}{why})"

    def _missing(self, graph: Graph, line: Sequence[Point], slot: int, fact: str) -> str:
        """Why ``fact`` does not hold at ``slot``: who ended it, or where its giver went."""
        ender = None
        for point in line[: slot + 1]:
            if point.name is None:
                continue
            if fact in graph.by_name[point.name].gives:
                ender = None
            elif fact in graph.by_name[point.name].ends and ender is None:
                ender = point.name
        if ender is not None:
            return f"{fact} ends at {ender}{self._rewrite(ender, fact)}"
        names = [p.name for p in line]
        givers = [s.name for s in self.base if fact in s.gives]
        for giver in givers:
            if giver in names[slot + 1:]:
                return f"{fact} comes only after {giver}{self._rewrite(giver)}"
            if giver not in names:
                return f"nothing gives {fact}{self._rewrite(giver, consumed=True)}"
        later = next((n for n in names[slot + 1:] if n and fact in graph.by_name[n].gives), None)
        if later is not None:
            return f"{fact} comes only after {later}{self._rewrite(later)}"
        return f"nothing gives {fact}"

    def _refuse_needs(self, graph: Graph, step: Step, needs: tuple[str, ...], implied: bool,
                      line: Sequence[Point], target: tuple[int, int]) -> PlacementError:
        low, high = target
        span = range(low, high + 1)
        fewest = min(len(set(needs) - line[i].state) for i in span)
        missing = dict.fromkeys(f for i in span if len(set(needs) - line[i].state) == fewest
                                for f in sorted(set(needs) - line[i].state))
        slot_of_fact = {f: next(i for i in span if f not in line[i].state) for f in missing}
        clauses = "; ".join(self._missing(graph, line, slot_of_fact[f], f) for f in missing)
        verb = "mean" if len(step.after + step.before) > 1 else "means"
        source = f"what {_anchors(step)} {verb} in the base graph" if implied else "declared"
        alternatives = self._needs_alternatives(graph, step, needs, line, target)
        instead = ("declare " + " or ".join(alternatives) if alternatives else
                   f"anchor it on one of: {', '.join(p.name for p in line if p.name)}")
        return PlacementError(
            f"{self._prefix(step)} needs the model {_facts(needs)} ({source}), which no point "
            f"{self._under()} has together: {clauses}; instead {instead}")

    def _needs_alternatives(self, graph: Graph, step: Step, needs: tuple[str, ...],
                            line: Sequence[Point], target: tuple[int, int]) -> list[str]:
        kept: dict[frozenset[str], int] = {}
        for slot, point in enumerate(line):
            subset = frozenset(needs) & point.state
            if subset and subset not in kept:
                kept[subset] = slot
        best = [k for k in kept if not any(k < other for other in kept)]
        best.sort(key=lambda k: (-len(k), _distance(kept[k], target), sorted(k)))
        found = []
        for subset in best:
            where = self.fits(graph, step.evolve(needs=tuple(sorted(subset))))
            if where is not None:
                found.append(f"needs={sorted(subset)!r} (runs {where})")
            if len(found) == 2:
                break
        return found

    def unmet(self, graph: Graph, step: Step) -> PlacementError:
        """The refusal of ``step`` (in ``graph``, where it stays) whose declared needs fail."""
        slot = slot_of(graph, step)
        rest = graph.remove(step.name)
        return self._refuse_needs(rest, step, step.needs, False, model_line(rest), (slot, slot))

    def _anchor_alternatives(self, graph: Graph, step: Step,
                             fits: Callable[[Step], str | None] | None = None) -> list[str]:
        fits = fits or (lambda variant: self.fits(graph, variant))
        found = []
        for field in ("after", "before"):
            for name in getattr(step, field):
                variant = step.evolve(after=(name,) if field == "after" else (),
                                      before=(name,) if field == "before" else ())
                if variant == step or name not in self.base and name not in graph:
                    continue
                where = fits(variant)
                if where is not None:
                    found.append(f"{field}={name!r} alone (runs {where})")
        return found

    def _contradiction(self, graph: Graph, asked: Step, step: Step, cycle: CycleError | None,
                       fits: Callable[[Step], str | None] | None = None) -> PlacementError:
        """``asked`` (``step`` once its anchors are renamed) fits nowhere in ``graph``'s order."""
        reason = self._clash(graph, step)
        if reason is None:
            reason = f"placed there it makes a {cycle}" if cycle else "it fits nowhere"
        alternatives = self._anchor_alternatives(graph, asked, fits)
        line = [p.name for p in model_line(graph) if p.name]
        instead = (" or ".join(f"keep {a}" for a in alternatives)
                   or f"anchor it on one of: {', '.join(line)}")
        return PlacementError(f"{self._prefix(asked)} says {_anchors(asked)}, but {reason}; "
                              f"instead {instead}")

    def contradiction(self, graph: Graph, step: Step,
                      fits: Callable[[Step], str | None]) -> PlacementError | None:
        """The refusal of ``step`` when its own anchors contradict ``graph``'s order."""
        if self._clash(graph, step) is None:
            return None
        return self._contradiction(graph, step, step, None, fits)

    def _clash(self, graph: Graph, step: Step) -> str | None:
        """``"b runs before a under 's' (path) (rewrite)"`` when ``step``'s anchors contradict."""
        dag = graph.digraph()
        for after in step.after:
            for before in step.before:
                if after == before:
                    return f"both name {after} {self._under()}{self._rewrite(after)}"
                if nx.has_path(dag, before, after):
                    path = nx.shortest_path(dag, before, after)
                    return (f"{before} runs before {after} {self._under()} "
                            f"({' -> '.join(path)}){self._order_rewrite(path)}")
        return None

    def _order_rewrite(self, path: Sequence[str]) -> str:
        """The rewrite that made the order ``path`` takes: a move, else an insert, else any."""
        for actions in (("moved",), ("inserted",), None):
            for name in reversed(path):
                if any(name in r.touched and (actions is None or r.touched[name] in actions)
                       for r, _ in self.records):
                    return self._rewrite(name)
        return ""

    def _unknown(self, graph: Graph, asked: Step, step: Step, name: str) -> UnknownStepError:
        """``asked`` names a step ``graph`` lacks (``name``, once renamed in ``step``)."""
        field = "after" if name in step.after else "before"
        said = next((a for a in getattr(asked, field) if a not in self.base or a == name), name)
        rest = asked.evolve(after=tuple(a for a in asked.after if a != said),
                            before=tuple(b for b in asked.before if b != said))
        where = self.fits(graph, rest) if rest.after or rest.before else None
        line = [p.name for p in model_line(graph) if p.name]
        instead = (f"; instead drop {field}={said!r} (runs {where})" if where is not None
                   else f"; instead anchor it on one of: {', '.join(line)}" if line else "")
        plan = f" {self._under()}" if self.strategy else ""
        return UnknownStepError(
            f"{self._prefix(asked)} says {field}={said!r}: no step named {name!r}{plan}"
            f"{did_you_mean(name, graph.names)}{instead}")

    def _placement(self, graph: Graph, line: Sequence[Point], step: Step,
                   needs: tuple[str, ...], slot: int, literal: Graph | None) -> str:
        """What a placement by need says: where, and why not where the anchors put it."""
        if literal is None:
            why = f"its anchors contradict: {self._clash(graph, step) or 'they make a cycle'}"
        else:
            at = slot_of(literal, literal.by_name[step.name])
            why = "; ".join(self._missing(graph, line, at, f)
                            for f in sorted(set(needs) - line[at].state))
        return f"{_where(line, slot)}, where the model has {_facts(needs)}" + (
            f" ({why})" if why else "")


def where_it_runs(graph: Graph, name: str) -> str:
    """``"after x, before y"``: where step ``name`` receives the model, on its line."""
    line = [p for p in model_line(graph) if p.name != name]
    return _where(line, slot_of(graph, graph.by_name[name]))


def _received(graph: Graph, name: str) -> frozenset[str]:
    return model_line(graph)[slot_of(graph, graph.by_name[name])].state


def _distance(slot: int, target: tuple[int, int]) -> int:
    low, high = target
    return 0 if low <= slot <= high else min(abs(slot - low), abs(slot - high))
