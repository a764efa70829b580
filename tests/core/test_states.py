"""Model states and needs: facts walked along the model's line, steps placed by what they need."""

from __future__ import annotations

import pytest

from flexgraph import (
    Configure,
    Fuse,
    Graph,
    IfAbsent,
    IfPresent,
    Insert,
    Move,
    Precedes,
    Remove,
    Replace,
    Step,
    StepDefinitionError,
    Strategy,
    UnknownStepError,
    make_plan,
    step,
)
from flexgraph.core.states import PlacementError, implied_needs, model_line, model_states
from tests.core.engine_helpers import mk


def line_graph() -> Graph:
    """build -> init -> load -> wrap, each saying what it makes of the model, then a reader."""
    return Graph.of(
        [
            mk("build_model", requires="cfg", provides="model", gives=("whole", "unwrapped")),
            mk("init_weights", updates="model", gives="initialised"),
            mk("load_checkpoint", updates="model", gives="loaded"),
            mk("wrap_model", updates="model", gives="on_device"),
            mk("train", requires="model"),
        ],
        inputs=["cfg"],
    )


ENGINE = Strategy("engine", [
    Replace("wrap_model", mk("engine", updates="model", gives="in_engine", ends="unwrapped"),
            why="the engine wraps the model"),
    Move("load_checkpoint", after="engine", why="weights go in through the engine"),
])


def user(name: str = "freeze", **fields: object) -> Step:
    return mk(name, updates="model", user="custom_steps", **fields)


# facts and states ---------------------------------------------------------------------------


def test_the_model_state_after_each_step_walks_its_line() -> None:
    plan = make_plan(line_graph())
    assert plan.states["build_model"] == ("unwrapped", "whole")
    assert plan.states["load_checkpoint"] == ("initialised", "loaded", "unwrapped", "whole")
    assert plan.states["train"] == plan.states["wrap_model"]
    graph = Graph.of([mk("a", provides="x"), mk("b", requires="x")])
    assert model_states(graph, graph.names) == {"a": None, "b": None}


def test_a_configure_changes_the_facts_a_step_gives() -> None:
    meta = Strategy("meta", [Configure("build_model", {"device": "meta"}, ends=("whole",),
                                       gives=("shell",))])
    plan = make_plan(line_graph(), meta)
    built = plan.graph.by_name["build_model"]
    assert (built.gives, built.ends) == (("unwrapped", "shell"), ("whole",))
    assert plan.states["build_model"] == ("shell", "unwrapped")


def test_a_fused_step_has_its_members_facts_in_turn() -> None:
    plan = make_plan(line_graph(), Strategy("f", [Fuse(("load_checkpoint", "wrap_model"),
                                                       "load_and_wrap")]))
    fused = plan.graph.by_name["load_and_wrap"]
    assert set(fused.gives) == {"loaded", "on_device"} and fused.ends == ()
    assert model_line(plan.graph)[-1].state == {"whole", "unwrapped", "initialised", "loaded",
                                                "on_device"}


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"gives": "x", "ends": "x"}, "both gives and ends 'x'"),
    ({"needs": "loaded", "requires": "cfg"}, "neither requires nor updates 'model'"),
    ({"gives": "not a fact", "updates": "model"}, "a fact is a short name"),
])
def test_a_step_with_contradictory_facts_is_refused(fields, fragment) -> None:
    with pytest.raises(StepDefinitionError, match=fragment):
        mk("s", **fields)


def test_the_decorator_takes_needs_and_facts() -> None:
    @step(updates="model", needs=["loaded"], gives="frozen")
    def freeze(model):
        return model

    assert (freeze.needs, freeze.gives) == (("loaded",), ("frozen",))


# implied needs ---------------------------------------------------------------------------


def test_a_users_anchors_mean_the_base_graphs_model_there() -> None:
    graph = line_graph().extend([user(after="load_checkpoint", before="wrap_model")])
    assert implied_needs(graph, graph.by_name["freeze"]) == (
        "initialised", "loaded", "unwrapped", "whole")
    own = line_graph().extend([mk("freeze", updates="model", after="load_checkpoint")])
    assert implied_needs(own, own.by_name["freeze"]) == ()  # the graph's own step: its author's


def test_a_readers_anchor_reads_the_model_there() -> None:
    graph = line_graph().extend([mk("count", requires="model", before="load_checkpoint",
                                    user="custom_steps")])
    assert implied_needs(graph, graph.by_name["count"]) == ("initialised", "unwrapped", "whole")


# placing ---------------------------------------------------------------------------------


def test_a_step_whose_needs_hold_at_its_anchors_stays_there() -> None:
    graph = line_graph().extend([user(after="load_checkpoint", before="wrap_model")])
    plan = make_plan(graph, Strategy("noop", [Configure("train", {"x": 1})]))
    assert plan.order.index("load_checkpoint") < plan.order.index("freeze") < plan.order.index(
        "wrap_model")
    assert plan.origin("freeze").action == "base"
    assert plan.implied["freeze"] == ("initialised", "loaded", "unwrapped", "whole")


def test_a_step_is_placed_where_its_needs_hold_and_the_plan_says_why() -> None:
    graph = line_graph().extend([user(after="load_checkpoint", before="wrap_model",
                                      needs="loaded")])
    plan = make_plan(graph, ENGINE)
    assert plan.order.index("load_checkpoint") < plan.order.index("freeze")
    origin = plan.origin("freeze")
    assert origin.short == "placed by need"
    assert origin.rewrite.startswith("after load_checkpoint, where the model has loaded")
    assert "engine #2: move load_checkpoint after engine: weights go in through the engine" in (
        origin.rewrite)


def test_a_step_whose_needs_hold_nowhere_is_refused_with_the_rewrite_and_a_way_out() -> None:
    graph = line_graph().extend([user(after="load_checkpoint", before="wrap_model")])
    with pytest.raises(PlacementError) as info:
        make_plan(graph, ENGINE)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("strategy 'engine': custom_steps: step 'freeze' needs the model "
                              "initialised, loaded, unwrapped, whole (what after="
                              "'load_checkpoint', before='wrap_model' mean in the base graph)")
    assert ("loaded comes only after load_checkpoint (engine #2: move load_checkpoint after "
            "engine: weights go in through the engine)") in message
    assert "unwrapped ends at engine (engine #1: " in message
    assert ("instead declare needs=['initialised', 'loaded', 'whole'] (runs after "
            "load_checkpoint) or needs=['initialised', 'unwrapped', 'whole'] (runs after "
            "init_weights, before engine)") in message


def test_anchors_that_contradict_the_base_order_are_refused_in_words() -> None:
    graph = line_graph().extend([user(after="wrap_model", before="init_weights")])
    with pytest.raises(PlacementError) as info:
        make_plan(graph)
    assert str(info.value) == (
        "custom_steps: step 'freeze' says after='wrap_model', before='init_weights', but "
        "init_weights runs before wrap_model in the base graph (init_weights -> load_checkpoint "
        "-> wrap_model); instead keep after='wrap_model' alone (runs after wrap_model) or keep "
        "before='init_weights' alone (runs after build_model, before init_weights)")


def test_a_step_without_needs_is_never_moved_to_break_a_cycle() -> None:
    graph = line_graph().extend([mk("freeze", updates="model", after="load_checkpoint",
                                    before="wrap_model", needs=())])
    with pytest.raises(Exception, match="cycle"):
        make_plan(graph, ENGINE)


def test_a_users_step_may_anchor_on_a_strategys_step() -> None:
    graph = line_graph().extend([user(after="engine")])
    assert "freeze" not in graph and [s.name for s in graph.pending] == ["freeze"]
    plan = make_plan(graph, ENGINE)
    assert plan.order.index("engine") < plan.order.index("freeze")
    with pytest.raises(UnknownStepError) as info:
        make_plan(graph)
    assert str(info.value) == (
        "custom_steps: step 'freeze' says after='engine': no step named 'engine'; instead "
        "anchor it on one of: build_model, init_weights, load_checkpoint, wrap_model")


def test_an_anchor_the_strategy_removed_means_its_neighbour() -> None:
    no_init = Strategy("no_init", [Remove("init_weights", why="the files set every weight")])
    graph = line_graph().extend([user(after="init_weights", before="load_checkpoint",
                                      needs="whole")])
    plan = make_plan(graph, no_init)
    assert plan.order.index("build_model") < plan.order.index("freeze") < plan.order.index(
        "load_checkpoint")
    assert plan.origin("freeze").action == "base"
    implied = line_graph().extend([user(after="init_weights", before="load_checkpoint")])
    with pytest.raises(PlacementError, match=r"nothing gives initialised \(no_init #1: remove "
                       r"init_weights: the files set every weight\); instead declare "
                       r"needs=\['unwrapped', 'whole'\] \(runs after build_model, before "
                       r"load_checkpoint\)$"):
        make_plan(implied, no_init)


def test_a_strategy_step_whose_declared_needs_fail_is_refused() -> None:
    strategy = Strategy("s", [Insert(mk("shard", updates="model", needs="loaded"),
                                     after="init_weights")])
    with pytest.raises(PlacementError, match="step 'shard' needs the model loaded .declared."):
        make_plan(line_graph(), strategy)


# reasons and skipped conditionals ----------------------------------------------------------


def test_every_rewrite_carries_its_reason_from_its_why_or_the_checks() -> None:
    strategy = Strategy("s", [
        Insert(mk("shard", updates="model"), after="init_weights"),
        Configure("train", {"x": 1}, why="one epoch"),
    ], checks=[Precedes("init_weights", "shard", "init writes whole tensors")])
    plan = make_plan(line_graph(), strategy)
    assert [r.why for r in plan.rewrites] == ["init writes whole tensors", "one epoch"]


def test_skipped_conditionals_keep_their_number_and_say_why() -> None:
    strategy = Strategy("s", [
        Remove("init_weights"),
        IfPresent("init_weights", Configure("init_weights", {"x": 1})),
        IfAbsent("init_weights", Configure("train", {"y": 2})),
        IfAbsent("load_checkpoint", Configure("train", {"z": 3})),
    ])
    plan = make_plan(line_graph(), strategy)
    assert [(r.index, r.applied, r.skipped) for r in plan.rewrites] == [
        (0, True, None),
        (1, False, "init_weights is not planned (taken out by s #1: remove init_weights)"),
        (2, True, None),
        (3, False, "load_checkpoint is planned"),
    ]


def test_an_updater_may_anchor_on_the_producer_alone() -> None:
    graph = line_graph().extend([mk("first", updates="model", after="build_model")])
    assert graph.chains["model"][0] == "first"
    assert make_plan(graph).order[:2] == ("build_model", "first")
