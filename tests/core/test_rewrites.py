"""Each rewrite: what it does to the graph, what it reports, what it refuses."""

from __future__ import annotations

import pytest

from flexgraph import (
    Configure,
    DuplicateStepError,
    Executor,
    Fuse,
    Graph,
    Insert,
    Move,
    Remove,
    Replace,
    RewriteDefinitionError,
    Step,
    Strategy,
    UnknownStepError,
    make_plan,
    step,
)
from tests.core.engine_helpers import mk, training_like


def order_after(*rewrites: object) -> tuple[str, ...]:
    return make_plan(training_like(), Strategy("s", rewrites)).order


def test_insert_after_puts_the_step_right_after_its_anchor() -> None:
    rewrite = Insert(mk("freeze", updates="model"), after="load_checkpoint")
    graph, touched = rewrite.apply(training_like())
    assert touched == {"freeze": "inserted"}
    assert rewrite.describe() == "insert freeze after load_checkpoint"
    assert graph.chains["model"] == ("init_weights", "load_checkpoint", "freeze", "wrap_model")
    assert graph.by_name["freeze"].after == ("load_checkpoint",)
    assert graph.names.index("freeze") == graph.names.index("load_checkpoint") + 1


def test_insert_before_puts_the_step_right_before_its_anchor() -> None:
    graph, _ = Insert(mk("shard", updates="model"), before="init_weights").apply(training_like())
    assert graph.chains["model"][0] == "shard"
    assert graph.by_name["shard"].before == ("init_weights",)


def test_insert_of_a_first_updater_of_an_artifact() -> None:
    graph, _ = Insert(mk("tune", updates="optim_wrapper"), after="build_optim_wrapper").apply(
        training_like()
    )
    assert graph.chains["optim_wrapper"] == ("tune",)
    order = make_plan(graph).order
    assert order.index("build_optim_wrapper") < order.index("tune") < order.index("train")


def test_insert_refuses_an_existing_name() -> None:
    with pytest.raises(DuplicateStepError, match="'wrap_model' exists; use a Replace"):
        Insert(mk("wrap_model"), after="build_model").apply(training_like())


def test_remove_drops_a_step() -> None:
    graph, touched = Remove("load_checkpoint").apply(training_like())
    assert "load_checkpoint" not in graph
    assert touched == {"load_checkpoint": "removed"}
    assert graph.chains["model"] == ("init_weights", "wrap_model")


def test_replace_keeps_the_slot_the_chain_place_and_the_references() -> None:
    base = training_like().add(mk("log", after="wrap_model"))
    new = mk("ddp_wrap", updates="model")
    graph, touched = Replace("wrap_model", new).apply(base)
    assert touched == {"ddp_wrap": "replaced"}
    assert graph.names.index("ddp_wrap") == base.names.index("wrap_model")
    assert graph.chains["model"] == ("init_weights", "load_checkpoint", "ddp_wrap")
    assert graph.by_name["log"].after == ("ddp_wrap",)
    assert Replace("wrap_model", new).describe() == (
        "replace wrap_model with ddp_wrap (tests:ddp_wrap)"
    )


def test_replace_under_the_same_name_swaps_the_function() -> None:
    graph, _ = Replace("wrap_model", Step("wrap_model", "ddp:wrap", updates="model")).apply(
        training_like()
    )
    assert graph.by_name["wrap_model"].fn == "ddp:wrap"
    assert graph.chains == training_like().chains


def test_move_splices_the_step_out_of_its_chain_and_in_at_the_anchor() -> None:
    graph, touched = Move("load_checkpoint", before="init_weights").apply(training_like())
    assert touched == {"load_checkpoint": "moved"}
    assert graph.chains["model"] == ("load_checkpoint", "init_weights", "wrap_model")
    order = make_plan(graph).order
    assert order[:4] == ("build_model", "load_checkpoint", "init_weights", "wrap_model")


def test_move_relinks_the_neighbours_it_leaves() -> None:
    graph, _ = Move("load_checkpoint", after="wrap_model").apply(training_like())
    edges = {(e.source, e.target) for e in graph.edges()}
    assert ("init_weights", "wrap_model") in edges
    assert ("wrap_model", "load_checkpoint") in edges
    assert ("load_checkpoint", "build_optim_wrapper") in edges


def test_move_replaces_the_moved_steps_own_ordering_edges() -> None:
    base = training_like().add(
        mk("freeze", updates="model", after="load_checkpoint", before="wrap_model")
    )
    graph, _ = Move("freeze", after="wrap_model").apply(base)
    assert graph.by_name["freeze"].after == ("wrap_model",)
    assert graph.by_name["freeze"].before == ()
    assert graph.chains["model"][-1] == "freeze"
    make_plan(graph)  # the old before=wrap_model would have made a cycle


def test_move_of_the_only_updater_of_an_artifact() -> None:
    graph = Graph.of([mk("make", provides="x"), mk("change", updates="x"), mk("other")])
    moved, _ = Move("change", after="other").apply(graph)
    assert moved.chains["x"] == ("change",)
    assert make_plan(moved).order == ("make", "other", "change")


def test_fuse_into_a_name_runs_the_members_in_order() -> None:
    calls: list[str] = []

    def wrap(model: list) -> list:
        calls.append("wrap")
        return [*model, "wrapped"]

    def optim(model: list) -> str:
        calls.append("optim")
        return f"optim({'+'.join(model)})"

    graph = Graph.of(
        [
            Step("build", lambda: ["m"], provides="model"),
            Step("wrap", wrap, updates="model"),
            Step("optim", optim, requires="model", provides="optim_wrapper"),
        ]
    )
    rewrite = Fuse(["wrap", "optim"], "setup")
    fused_graph, touched = rewrite.apply(graph)
    fused = fused_graph.by_name["setup"]
    assert touched == {"setup": "fused"}
    assert rewrite.describe() == "fuse wrap, optim into setup"
    assert (fused.requires, fused.provides, fused.updates) == ((), ("optim_wrapper",), ("model",))
    assert fused_graph.names == ("build", "setup")
    plan = make_plan(graph, Strategy("s", [rewrite]))
    context = Executor().run(plan).context
    assert calls == ["wrap", "optim"]
    assert context["optim_wrapper"] == "optim(m+wrapped)"


def test_fuse_into_a_given_step_takes_the_earliest_members_place() -> None:
    initialize = Step(
        "deepspeed_initialize", "ds:init", updates="model", provides="optim_wrapper"
    )
    plan = make_plan(
        training_like(), Strategy("ds", [Fuse(["wrap_model", "build_optim_wrapper"], initialize)])
    )
    assert plan.order == (
        "build_model", "init_weights", "load_checkpoint", "deepspeed_initialize",
        "build_param_schedulers", "train",
    )
    assert plan.graph.chains["model"][-1] == "deepspeed_initialize"
    assert str(plan.origin("deepspeed_initialize")).startswith("fused by ds #1")


def test_configure_merges_parameters() -> None:
    base = Graph.of([mk("train", params={"epochs": 1, "lr": 0.1})])
    graph, touched = Configure("train", {"epochs": 3}).apply(base)
    assert dict(graph.by_name["train"].params) == {"epochs": 3, "lr": 0.1}
    assert touched == {"train": "configured"}
    assert Configure("train", {"epochs": 3}).describe() == "configure train: epochs=3"


@pytest.mark.parametrize(
    "rewrite",
    [
        Insert(mk("x"), after="wrap_modle"),
        Remove("wrap_modle"),
        Replace("wrap_modle", mk("x")),
        Move("wrap_modle", after="build_model"),
        Move("build_model", before="wrap_modle"),
        Fuse(["wrap_modle", "build_model"], "x"),
        Configure("wrap_modle", {}),
    ],
    ids=lambda r: r.describe(),
)
def test_every_rewrite_refuses_an_unknown_step_with_a_did_you_mean(rewrite: object) -> None:
    with pytest.raises(UnknownStepError, match=r"'wrap_modle' \(did you mean 'wrap_model'\?\)"):
        rewrite.apply(training_like())


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Insert(mk("x")), "insert x needs after= or before="),
        (lambda: Move("a", after="b", before="c"), "takes after= or before=, not both"),
        (lambda: Move("a", after="a"), "cannot move a step next to itself"),
        (lambda: Fuse(["a"], "x"), "fuse needs at least two steps"),
    ],
)
def test_malformed_rewrites_are_refused_when_made(make: object, message: str) -> None:
    with pytest.raises(RewriteDefinitionError, match=message):
        make()


def test_rewrites_never_change_the_graph_they_are_given() -> None:
    base = training_like()
    snapshot = (base.names, dict(base.chains))
    for rewrite in (
        Insert(mk("x", updates="model"), after="init_weights"),
        Remove("init_weights"),
        Move("wrap_model", before="init_weights"),
        Fuse(["wrap_model", "build_optim_wrapper"], "both"),
    ):
        rewrite.apply(base)
        assert (base.names, dict(base.chains)) == snapshot
    assert order_after() == make_plan(base).order


def test_a_fused_step_with_one_output_returns_that_value():
    """The composite keeps the step contract: one output is the value, not a mapping."""

    def make(x):
        return x + 1

    def double(y):
        return y * 2

    graph = Graph.of([step(make, provides="y"), step(double, updates="y")], inputs=["x"])
    plan = make_plan(graph, Strategy("s", [Fuse(["make", "double"], into="both")]))
    assert plan.graph.by_name["both"].outputs == ("y",)
    assert Executor().run(plan, {"x": 1}).context["y"] == 4
