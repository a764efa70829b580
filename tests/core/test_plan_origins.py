"""Plans: order, stages, where each step came from, and explain()."""

from __future__ import annotations

import pytest

from flexgraph import Configure, Fuse, Insert, Move, Origin, Remove, Strategy, make_plan
from flexgraph.core.plan import BASE
from tests.core.engine_helpers import mk, training_like

FSDP_LIKE = Strategy(
    "fsdp_like",
    [
        Insert(mk("fully_shard", updates="model"), after="build_model"),
        Move("init_weights", after="fully_shard"),
        Configure("train", {"epochs": 2}),
        Configure("train", {"lr": 0.1}),
    ],
)


def test_without_a_strategy_every_step_is_base() -> None:
    plan = make_plan(training_like())
    assert plan.strategy is None and plan.rewrites == ()
    assert plan.order == plan.base_order == training_like().names
    assert all(plan.origin(n) == BASE for n in plan.order)
    assert str(plan.origin("train")) == "base"


def test_origins_name_the_strategy_the_rewrite_and_what_it_did() -> None:
    plan = make_plan(training_like(), FSDP_LIKE)
    assert plan.origin("fully_shard") == Origin(
        "inserted", "fsdp_like", 0, "insert fully_shard after build_model"
    )
    assert str(plan.origin("init_weights")) == (
        "moved by fsdp_like #2: move init_weights after fully_shard"
    )
    assert plan.origin("build_model") == BASE
    assert plan.origin("fully_shard").to_dict() == {
        "action": "inserted", "strategy": "fsdp_like", "index": 0,
        "rewrite": "insert fully_shard after build_model",
    }


def test_history_keeps_every_rewrite_and_origin_is_the_last() -> None:
    plan = make_plan(training_like(), FSDP_LIKE)
    assert [o.rewrite for o in plan.history["train"]] == [
        "configure train: epochs=2", "configure train: lr=0.1"
    ]
    assert plan.origin("train").index == 3
    assert dict(plan.graph.by_name["train"].params) == {"epochs": 2, "lr": 0.1}


def test_applied_rewrites_are_listed_in_order() -> None:
    plan = make_plan(training_like(), FSDP_LIKE)
    assert [(r.index, r.kind, r.description) for r in plan.rewrites] == [
        (0, "insert", "insert fully_shard after build_model"),
        (1, "move", "move init_weights after fully_shard"),
        (2, "configure", "configure train: epochs=2"),
        (3, "configure", "configure train: lr=0.1"),
    ]
    assert dict(plan.rewrites[1].touched) == {"init_weights": "moved"}


def test_removed_and_fused_steps_leave_no_history_behind() -> None:
    plan = make_plan(
        training_like(),
        Strategy("s", [Configure("wrap_model", {"a": 1}), Remove("init_weights"),
                       Fuse(["wrap_model", "build_optim_wrapper"], "init_all")]),
    )
    assert set(plan.history) == {"init_all"}
    assert plan.origin("init_all").action == "fused"


def test_the_order_breaks_ties_by_declaration_order() -> None:
    plan = make_plan(training_like().extend([mk("z_first"), mk("a_second")]))
    assert plan.order[-2:] == ("z_first", "a_second")
    assert plan.stages[0] == ("build_model", "z_first", "a_second")


def test_stages_are_topological_generations() -> None:
    plan = make_plan(training_like())
    assert plan.stages == (
        ("build_model",), ("init_weights",), ("load_checkpoint",), ("wrap_model",),
        ("build_optim_wrapper",), ("build_param_schedulers",), ("train",),
    )


def test_steps_are_in_execution_order() -> None:
    plan = make_plan(training_like(), FSDP_LIKE)
    assert tuple(s.name for s in plan.steps) == plan.order


def test_explain_says_where_a_step_came_from_and_what_it_waits_for() -> None:
    text = make_plan(training_like(), FSDP_LIKE).explain("init_weights")
    assert text.splitlines() == [
        "init_weights is step 3 of 8 (tests:init_weights)",
        "  moved by fsdp_like #2: move init_weights after fully_shard",
        "  runs after:",
        "    fully_shard: init_weights says after=fully_shard; "
        "init_weights updates model after fully_shard",
        "  runs before:",
        "    load_checkpoint: load_checkpoint updates model after init_weights",
    ]


def test_explain_of_a_base_step_and_of_a_lonely_step() -> None:
    plan = make_plan(training_like().add(mk("alone")))
    assert "declared by the base graph, untouched by the strategy" in plan.explain("train")
    assert "no edges: its place comes from declaration order alone" in plan.explain("alone")


def test_origin_of_an_unknown_step_has_a_did_you_mean() -> None:
    with pytest.raises(LookupError, match="did you mean 'train'"):
        make_plan(training_like()).origin("trian")
