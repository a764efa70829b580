"""Each engine error: its class, its builtin, and a message that names the culprit."""

from __future__ import annotations

import pytest

import flexgraph
from flexgraph import (
    AmbiguousOrderError,
    CycleError,
    DuplicateProducerError,
    DuplicateStepError,
    FlexgraphError,
    Graph,
    Insert,
    MissingInputError,
    Move,
    Step,
    StepDefinitionError,
    StepFunctionError,
    Strategy,
    StrategyOptionError,
    UnknownStepError,
    UnknownStrategyError,
    get_strategy,
    make_plan,
    register_strategy,
)
from flexgraph.core import strategy as strategy_module
from flexgraph.core.step import resolve_fn
from tests.core.engine_helpers import mk, training_like


def test_every_public_error_is_a_flexgraph_error_and_a_builtin() -> None:
    errors = [
        obj for name, obj in vars(flexgraph).items()
        if name.endswith("Error") and isinstance(obj, type)
    ]
    assert len(errors) >= 14
    for error in errors:
        if error is FlexgraphError:
            continue
        assert issubclass(error, FlexgraphError), error
        builtins = [b for b in error.__mro__ if b.__module__ == "builtins"]
        assert any(b not in (Exception, BaseException, object) for b in builtins), error


def test_a_cycle_prints_its_path_and_why_each_edge_exists() -> None:
    g = Graph.of([mk("a", after="c"), mk("b", after="a"), mk("c", after="b")])
    with pytest.raises(CycleError) as info:
        make_plan(g)
    message = str(info.value)
    assert message.startswith("cycle: ")
    path = message.split(" (")[0].removeprefix("cycle: ").split(" -> ")
    assert path[0] == path[-1] and sorted(path[:-1]) == ["a", "b", "c"]
    assert "b says after=a" in message and "a says after=c" in message


def test_a_move_that_makes_a_cycle_names_the_strategy_and_the_rewrite() -> None:
    strategy = Strategy("bad", [Move("build_model", after="train")])
    with pytest.raises(CycleError, match=r"^strategy 'bad', rewrite #1 \(move build_model after "
                       r"train\): cycle: "):
        make_plan(training_like(), strategy)


def test_a_missing_input_names_the_step_and_the_artifact_with_a_did_you_mean() -> None:
    with pytest.raises(MissingInputError) as info:
        make_plan(training_like().add(mk("evaluate", requires="modle")))
    assert str(info.value) == (
        "step 'evaluate' needs artifact 'modle', which no step provides and no input "
        "supplies (did you mean 'model'?)"
    )


def test_an_update_of_nothing_is_a_missing_input_too() -> None:
    with pytest.raises(MissingInputError, match="step 'tweak' needs artifact 'ghost'"):
        make_plan(Graph.of([mk("tweak", updates="ghost")]))


def test_a_duplicate_producer_names_both_steps() -> None:
    with pytest.raises(DuplicateProducerError, match="'model' is provided by both 'build_model' "
                       "and 'build_other'"):
        make_plan(training_like().add(mk("build_other", provides="model")))


def test_an_input_that_a_step_also_provides_is_a_duplicate_producer() -> None:
    with pytest.raises(DuplicateProducerError, match="'cfg' is a graph input and is also "
                       "provided by step 'make_cfg'"):
        make_plan(training_like().add(mk("make_cfg", provides="cfg")))


def test_ambiguous_updaters_name_both_steps_the_artifact_and_the_fix() -> None:
    with pytest.raises(AmbiguousOrderError) as info:
        training_like().add(mk("freeze", updates="model"))
    assert str(info.value) == (
        "steps 'freeze' and 'wrap_model' both update 'model' with no order between them; "
        "give 'freeze' after= or before= one of: init_weights, load_checkpoint, wrap_model"
    )


def test_an_unknown_step_in_a_rewrite_has_a_did_you_mean() -> None:
    strategy = Strategy("fsdp", [Insert(mk("shard", updates="model"), after="build_modle")])
    with pytest.raises(UnknownStepError) as info:
        make_plan(training_like(), strategy)
    assert str(info.value) == (
        "strategy 'fsdp', rewrite #1: insert shard after build_modle: no step named "
        "'build_modle' (did you mean 'build_model' or 'build_param_schedulers'?)"
    )
    assert isinstance(info.value, LookupError)


def test_an_unknown_ordering_reference_names_the_step_and_field() -> None:
    with pytest.raises(UnknownStepError, match=r"step 'b' says before='wrap_modle': no step "
                       r"named 'wrap_modle' \(did you mean 'wrap_model'\?\)"):
        make_plan(training_like().add(mk("b", before="wrap_modle")))


def registered(monkeypatch: pytest.MonkeyPatch, name: str, factory: object) -> None:
    """Register ``factory`` for this test only."""
    monkeypatch.setattr(strategy_module, "_registered", dict(strategy_module._registered))
    register_strategy(name, factory)


def test_an_unknown_strategy_lists_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    registered(monkeypatch, "test_only_strategy", lambda: Strategy("test_only_strategy"))
    with pytest.raises(UnknownStrategyError) as info:
        get_strategy("test_only_strateg")
    message = str(info.value)
    assert "(did you mean 'test_only_strategy'?)" in message
    assert "known: " in message and "test_only_strategy" in message.split("known: ")[1]


def test_spec_strategies_shadow_registered_ones_and_take_no_options() -> None:
    mine = Strategy("ddp")
    assert get_strategy("ddp", extra={"ddp": mine}) is mine
    with pytest.raises(StrategyOptionError, match="defined in the spec and takes no options"):
        get_strategy({"type": "ddp", "fp16": True}, extra={"ddp": mine})


def test_a_strategy_option_the_factory_does_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    registered(monkeypatch, "opt_test", lambda stage=1: Strategy(f"opt_test{stage}"))
    assert get_strategy({"type": "opt_test", "stage": 3}).name == "opt_test3"
    with pytest.raises(StrategyOptionError, match="strategy 'opt_test'"):
        get_strategy("opt_test", stag=3)
    with pytest.raises(StrategyOptionError, match="has no 'type'"):
        get_strategy({"stage": 3})


def test_duplicate_step_names() -> None:
    with pytest.raises(DuplicateStepError, match="two steps are named 'a'"):
        Graph.of([mk("a"), mk("a")])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "not a name"}, "must be a Python identifier"),
        ({"name": "a", "requires": "x", "updates": "x"}, "in both requires and updates"),
        ({"name": "a", "requires": ("x", "x")}, "lists artifact 'x' twice in requires"),
        ({"name": "a", "after": "a"}, "cannot be ordered relative to itself"),
        ({"name": "a", "provides": ("",)}, "provides has a non-name"),
    ],
)
def test_malformed_steps(fields: dict, message: str) -> None:
    with pytest.raises(StepDefinitionError, match=message):
        Step(fn="m:f", **fields)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("nomodule_xyz:f", "no module named 'nomodule_xyz'"),
        ("json:loadz", r"'json' has no attribute 'loadz' \(did you mean 'load' or 'loads'\?\)"),
        ("json:__doc__", "is not callable"),
        ("noseparator", "not of the form 'module:attr'"),
    ],
)
def test_unresolvable_functions(ref: str, message: str) -> None:
    with pytest.raises(StepFunctionError, match=message):
        resolve_fn(ref)
