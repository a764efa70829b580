"""What the views agree on: which rewrite took a base step out, what an edge carries."""

from __future__ import annotations

from flexgraph import Edge, Fuse, Graph, Insert, Remove, Step, Strategy, make_plan
from flexgraph.render._changes import edge_artifacts, first_action, gone_steps


def test_gone_steps_name_the_rewrite_and_the_successor(plan):
    gone = gone_steps(plan)
    assert list(gone) == ["wrap_model", "build_optim_wrapper", "resume", "build_param_schedulers"]
    assert (gone["wrap_model"].action, gone["wrap_model"].into) == ("replaced", "shard_model")
    assert (gone["build_optim_wrapper"].action, gone["build_optim_wrapper"].into) == (
        "fused", "build_optim",
    )
    assert (gone["resume"].action, gone["resume"].into) == ("removed", None)
    assert gone["resume"].rewrite.index == 5
    assert str(gone["resume"]) == "removed by demo #6: remove resume"


def test_fusing_into_a_members_name_keeps_that_member(plain):
    graph = Graph.of([Step("a", "m:a", provides="x"), Step("b", "m:b", requires="x",
                                                           provides="y")])
    plan = make_plan(graph, Strategy("s", [Fuse(("a", "b"), "a")]))
    assert list(gone_steps(plan)) == ["b"]


def test_first_action_is_what_placed_the_step():
    graph = Graph.of([Step("a", "m:a", provides="x")])
    strategy = Strategy("s", [
        Insert(Step("b", "m:b", requires="x"), after="a"),
        Remove("b"),
        Insert(Step("b", "m:b2", requires="x"), after="a"),
    ])
    plan = make_plan(graph, strategy)
    assert first_action(plan, "a") == "base"
    assert first_action(plan, "b") == "inserted"
    assert gone_steps(plan) == {}


def test_edge_artifacts_come_from_the_reason_and_the_steps():
    graph = Graph.of([
        Step("a", "m:a", provides=("model", "model_ema")),
        Step("b", "m:b", requires="model_ema", after="a"),
    ])
    plan = make_plan(graph)
    (edge,) = plan.edges
    assert edge_artifacts(plan, edge) == ("model_ema",)  # not "model", a prefix of it
    ordering = Edge("a", "b", "b says after=a")
    assert edge_artifacts(plan, ordering) == ()
