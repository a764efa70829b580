"""Derived rewrites: a step pruned for a reason found in the run's inputs, before the
strategy's rewrites, which fit the graph with or without it (IfPresent / IfAbsent)."""

from __future__ import annotations

import pytest

from flexgraph import (
    IfAbsent,
    IfPresent,
    Insert,
    PlanCheckError,
    Precedes,
    Prune,
    Strategy,
    UnknownStepError,
    make_plan,
)
from flexgraph.render import derivation_lines, plan_diff, plan_json, pruned_steps
from tests.core.engine_helpers import mk, training_like

WHY = "every state_dict entry comes from load_from 'x.pth'"

SHARDS = Strategy("shards", [
    IfPresent("init_weights", Insert(mk("scatter", updates="model"), after="init_weights")),
    IfAbsent("init_weights", Insert(mk("materialize", updates="model"), after="build_model")),
], checks=[Precedes("init_weights", "scatter", "init writes whole tensors",
                    first_optional=True)])


def test_a_prune_drops_its_step_and_says_why() -> None:
    rewrite = Prune("init_weights", WHY)
    graph, touched = rewrite.apply(training_like())
    assert "init_weights" not in graph.names
    assert touched == {"init_weights": "pruned"}
    assert str(rewrite) == f"prune init_weights ({WHY})"
    assert rewrite.kind == "prune" and rewrite.touches == ("init_weights",)


def test_a_prune_of_an_unknown_step_is_refused_with_close_names() -> None:
    with pytest.raises(UnknownStepError, match="init_weight.*init_weights"):
        make_plan(training_like(), derived=[Prune("init_weight", WHY)])


def test_derived_rewrites_apply_before_the_strategy_which_fits_either_graph() -> None:
    kept = make_plan(training_like(), SHARDS)
    assert "scatter" in kept.order and "materialize" not in kept.order
    pruned = make_plan(training_like(), SHARDS, derived=[Prune("init_weights", WHY)])
    assert "init_weights" not in pruned.order
    assert "materialize" in pruned.order and "scatter" not in pruned.order
    assert [(r.strategy, r.index, r.kind) for r in pruned.rewrites] == [
        ("derived", 0, "prune"), ("shards", 0, "insert"), ("shards", 1, "insert")]
    assert pruned.rewrites[2].description == \
        "insert materialize after build_model, when init_weights is not planned"
    assert pruned.rewrites[1].touched == {}, "IfPresent did nothing without init_weights"


def test_a_check_on_an_optional_step_holds_only_when_it_is_planned() -> None:
    make_plan(training_like(), SHARDS, derived=[Prune("init_weights", WHY)])  # passes
    strict = Strategy("strict", SHARDS.rewrites, checks=[
        Precedes("init_weights", "scatter", "init writes whole tensors")])
    bad = Strategy("bad", [Insert(mk("scatter", updates="model"), after="build_model")],
                   checks=[Precedes("init_weights", "scatter", "init writes whole tensors")])
    with pytest.raises(PlanCheckError, match="scatter needs init_weights before it"):
        make_plan(training_like(), bad, derived=[Prune("init_weights", WHY)])
    assert "scatter" in make_plan(training_like(), strict).order


def test_views_show_a_pruned_step_as_removed_with_its_reason() -> None:
    plan = make_plan(training_like(), SHARDS, derived=[Prune("init_weights", WHY)])
    assert pruned_steps(plan) == {"init_weights": WHY}
    assert derivation_lines({"pruned": pruned_steps(plan), "notes": {"x": "y"}}) == [
        f"pruned: init_weights ({WHY})", "x: y"]
    assert '"kind": "prune"' in plan_json(plan) and '"strategy": "derived"' in plan_json(plan)
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None)
    console.print(plan_diff(plan))
    text = console.export_text()
    assert f"init_weights removed by derived #1: prune init_weights ({WHY})" in text


def test_a_strategy_says_which_steps_a_run_may_prune() -> None:
    assert Strategy("s").prunable == ()
    assert Strategy("s", prunable=["init_weights"]).prunable == ("init_weights",)
