"""Property tests: random valid graphs and random strategies always give valid plans.

Rewrites are drawn against the graph as it stands; the ones the engine refuses
(with a FlexgraphError, as it must for e.g. a move that makes a cycle) are
skipped. Whatever survives must give a plan whose order is a permutation of the
steps, respects every derived edge, and agrees with the stages.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexgraph import (
    Configure,
    FlexgraphError,
    Fuse,
    Graph,
    Insert,
    Move,
    Remove,
    Replace,
    Strategy,
    make_plan,
)
from flexgraph.core.rewrite import Rewrite
from flexgraph.core.validate import validate
from tests.core.engine_helpers import check_plan, mk
from tests.core.random_graphs import random_graph

EXAMPLES = int(os.environ.get("FLEXGRAPH_EXAMPLES", "300"))  # raise it to hunt harder
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@given(random_graph())
@SETTINGS
def test_random_graphs_plan_validly(graph: Graph) -> None:
    plan = make_plan(graph)
    check_plan(plan)
    assert plan.order == plan.base_order


def draw_rewrite(data: st.DataObject, graph: Graph, serial: int) -> Rewrite:
    names = list(graph.names)
    pick = lambda: data.draw(st.sampled_from(names))  # noqa: E731
    artifacts = sorted(graph.artifacts)
    kind = data.draw(st.sampled_from(["insert", "remove", "replace", "move", "fuse", "configure"]))
    where = data.draw(st.sampled_from(["after", "before"]))
    if kind in ("insert", "replace"):
        fields: dict[str, object] = {"provides": f"new{serial}"}
        if artifacts and data.draw(st.booleans()):
            fields["requires"] = data.draw(st.sampled_from(artifacts))
        if artifacts and data.draw(st.booleans()):
            updated = data.draw(st.sampled_from(artifacts))
            if updated != fields.get("requires"):
                fields["updates"] = updated
        if kind == "insert":
            return Insert(mk(f"n{serial}", **fields), **{where: pick()})
        old = pick()
        keep_name = data.draw(st.booleans())
        return Replace(old, mk(old if keep_name else f"n{serial}", **fields))
    if kind == "remove":
        return Remove(pick())
    if kind == "configure":
        return Configure(pick(), {"k": serial})
    if kind == "fuse":
        members = data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=3, unique=True))
        into = data.draw(st.sampled_from([f"f{serial}", members[0], "step"]))
        if into == "step":  # a given Step doing the members' work, like deepspeed_initialize
            fused = graph.by_name
            updates = sorted({a for m in members for a in fused[m].updates})
            into = mk(f"f{serial}", updates=updates, provides=f"fused{serial}")
        return Fuse(members, into)
    mover, anchor = pick(), pick()
    return Move(mover, **{where: anchor})


@given(random_graph(), st.data())
@SETTINGS
def test_random_strategies_give_valid_plans(graph: Graph, data: st.DataObject) -> None:
    kept: list[Rewrite] = []
    plan = make_plan(graph)
    for serial in range(data.draw(st.integers(1, 8))):
        if len(plan.graph) < 2:
            break
        try:
            rewrite = draw_rewrite(data, plan.graph, serial)
            candidate = make_plan(graph, Strategy("random", [*kept, rewrite]))
        except FlexgraphError:
            continue
        kept.append(rewrite)
        plan = candidate
        check_plan(plan)
        validate(plan.graph)
    assert [r.description for r in plan.rewrites] == [r.describe() for r in kept]


@given(random_graph(), st.data())
@SETTINGS
def test_moved_and_inserted_steps_sit_next_to_their_anchor(
    graph: Graph, data: st.DataObject
) -> None:
    if len(graph) < 2:
        return
    names = list(graph.names)
    mover = data.draw(st.sampled_from(names))
    anchor = data.draw(st.sampled_from([n for n in names if n != mover]))
    where = data.draw(st.sampled_from(["after", "before"]))
    for rewrite, moved in ((Move(mover, **{where: anchor}), mover),
                           (Insert(mk("fresh"), **{where: anchor}), "fresh")):
        try:
            plan = make_plan(graph, Strategy("s", [rewrite]))
        except FlexgraphError:
            continue
        check_plan(plan)
        order = plan.order
        if where == "after":
            assert order.index(moved) > order.index(anchor)
        else:
            assert order.index(moved) < order.index(anchor)
