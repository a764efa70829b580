"""A user's step under every built-in strategy: placed where its needs hold, or refused with why.

The step of the design page's example (updates the model, ``after=X, before=Y``),
for every ordered pair of the model's steps, the standard graph's and every
strategy's own, under single, DDP, FSDP (its three orders), HSDP and ZeRO-1/2/3.
Pure planning: no torch.
"""

from __future__ import annotations

import re

import pytest

from flexgraph import FlexgraphError, Prune, Step, get_strategy, make_plan
from flexgraph.core.states import model_line, slot_of, where_it_runs
from flexgraph.training.graph import standard_graph

PRUNED = (Prune("init_weights", "every state_dict entry comes from load_from 'w.pth'"),)
STRATEGIES = {
    "none": (None, ()),
    "single": ({"type": "single"}, ()),
    "ddp": ({"type": "ddp"}, ()),
    "fsdp": ({"type": "fsdp"}, ()),
    "fsdp_pruned": ({"type": "fsdp"}, PRUNED),
    "fsdp_skip_init": ({"type": "fsdp", "skip_init_weights": True}, ()),
    "fsdp_checkpointing": ({"type": "fsdp", "activation_checkpointing": {}}, ()),
    "hsdp": ({"type": "fsdp", "model_wrapper": {"sharding_strategy": "HYBRID_SHARD",
                                                "device_mesh": (2, 4)}}, ()),
    "zero1": ({"type": "deepspeed", "zero_optimization": {"stage": 1}}, ()),
    "zero2": ({"type": "deepspeed", "zero_optimization": {"stage": 2}}, ()),
    "zero3": ({"type": "deepspeed", "zero_optimization": {"stage": 3}}, ()),
    "zero3_pruned": ({"type": "deepspeed", "zero_optimization": {"stage": 3}}, PRUNED),
}
MODEL_STEPS = ("build_model", "init_weights", "load_checkpoint", "wrap_model", "compile",
               "activation_checkpointing", "fully_shard", "materialize",
               "deepspeed_initialize", "follow_init_draws")
PAIRS = [(x, y) for x in MODEL_STEPS for y in MODEL_STEPS if x != y]
BASE = standard_graph({"compile": True})
ALTERNATIVE = re.compile(
    r"(needs=\[[^\]]*\]|(?:after|before)='\w+' alone|drop (?:after|before)='\w+') "
    r"\(runs ([^)]*)\)")
REASON = re.compile(r"\(\w+ #\d+: [^)]*: [^)]+\)|in the base graph|no step named")


def user_step(**fields: object) -> Step:
    return Step("count_and_freeze", "mysteps:count_and_freeze", updates="model",
                user="custom_steps", **fields)


def plan_with(step: Step, strategy_name: str):
    options, derived = STRATEGIES[strategy_name]
    strategy = get_strategy(dict(options)) if options else None
    return make_plan(BASE.extend([step]), strategy, derived=derived)


def renamed(plan, name: str) -> str | None:
    """What an anchor names once the strategy's rewrites took steps out (None: gone)."""
    gone = {n: into for r in plan.rewrites for n, into in r.consumed.items()}
    while name not in plan.graph and name in gone:
        name = gone[name]
    return name


def check_placed(plan, step: Step) -> None:
    """Its needs hold where it runs; where it breaks an anchor, the plan says it placed it."""
    needs = step.needs or plan.implied.get(step.name, ())
    received = model_line(plan.graph)[slot_of(plan.graph, plan.graph.by_name[step.name])]
    assert set(needs) <= received.state, (needs, received)
    at = plan.order.index(step.name)
    after = [a for a in (renamed(plan, n) for n in step.after) if a in plan.order]
    before = [b for b in (renamed(plan, n) for n in step.before) if b in plan.order]
    kept = all(plan.order.index(a) < at for a in after) and all(
        at < plan.order.index(b) for b in before)
    if not kept:
        assert plan.origin(step.name).short == "placed by need", plan.origin(step.name)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
@pytest.mark.parametrize(("after", "before"), PAIRS, ids=[f"{x}-{y}" for x, y in PAIRS])
def test_every_pair_of_model_steps_is_placed_by_need_or_refused_with_a_way_out(
    after: str, before: str, strategy_name: str,
) -> None:
    step = user_step(after=after, before=before)
    try:
        plan = plan_with(step, strategy_name)
    except FlexgraphError as refusal:
        message = str(refusal)
        assert "\n" not in message and "'count_and_freeze'" in message, message
        assert REASON.search(message), f"no reason: {message}"
        head, _, instead = message.partition("; instead ")
        assert instead, f"no alternative: {message}"
        alternatives = ALTERNATIVE.findall(instead)
        if not alternatives:  # nothing in the user's words fits: the model's steps are named
            assert instead.startswith("anchor it on one of: "), message
        for asked, runs in alternatives:
            fixed = _apply(step, asked)
            fixed_plan = plan_with(fixed, strategy_name)
            check_placed(fixed_plan, fixed)
            assert where_it_runs(fixed_plan.graph, step.name) == runs, (asked, message)
        return
    check_placed(plan, step)


def _apply(step: Step, asked: str) -> Step:
    if asked.startswith("needs="):
        return step.evolve(needs=tuple(re.findall(r"'(\w+)'", asked)))
    field, name = re.search(r"(after|before)='(\w+)'", asked).groups()
    if asked.startswith("drop "):
        return step.evolve(**{field: tuple(n for n in getattr(step, field) if n != name)})
    return step.evolve(after=(name,) if field == "after" else (),
                       before=(name,) if field == "before" else ())


# the example: the design page's step, under each strategy ---------------------------

EXAMPLE = {"after": "load_checkpoint", "before": "wrap_model"}


@pytest.mark.parametrize("strategy_name", ["none", "single", "ddp"])
def test_the_example_runs_where_the_user_meant_on_one_copy_of_the_model(strategy_name) -> None:
    plan = plan_with(user_step(**EXAMPLE), strategy_name)
    at = plan.order.index("count_and_freeze")
    assert plan.order.index("load_checkpoint") < at < plan.order.index("wrap_model")
    assert plan.origin("count_and_freeze").action == "base"
    assert plan.states[plan.order[at]] == ("initialised", "loaded", "unwrapped", "whole")


@pytest.mark.parametrize(("strategy_name", "culprit", "instead"), [
    ("fsdp", "whole ends at build_model (fsdp #2: configure build_model: device='meta': ",
     "needs=['initialised', 'loaded'] (runs after load_checkpoint, before wrap_model)"),
    ("hsdp", "unwrapped ends at fully_shard (fsdp #3: insert fully_shard after build_model",
     "needs=['unwrapped'] (runs after compile, before fully_shard)"),
    ("zero1", "loaded comes only after load_checkpoint (deepspeed #3: move load_checkpoint "
              "after deepspeed_initialize: the engine owns the parameters",
     "needs=['initialised', 'unwrapped', 'whole'] (runs after init_weights, before "
     "deepspeed_initialize)"),
    ("zero2", "unwrapped ends at deepspeed_initialize (deepspeed #2: fuse wrap_model, "
              "build_optim_wrapper into deepspeed_initialize: ",
     "needs=['initialised', 'loaded', 'whole'] (runs after load_checkpoint, before compile)"),
    ("zero3", "whole ends at build_model (deepspeed #2: configure build_model: init_context=",
     "needs=['initialised', 'loaded', 'unwrapped'] (runs after load_checkpoint, before "
     "deepspeed_initialize)"),
])
def test_the_example_is_refused_where_the_model_is_not_whole_or_not_loaded_before_wrapping(
    strategy_name: str, culprit: str, instead: str,
) -> None:
    with pytest.raises(FlexgraphError) as info:
        plan_with(user_step(**EXAMPLE), strategy_name)
    message = str(info.value)
    assert message.startswith("strategy ")
    assert "custom_steps: step 'count_and_freeze' needs the model initialised, loaded, " \
           "unwrapped, whole (what after='load_checkpoint', before='wrap_model' mean in the " \
           "base graph)" in message
    assert culprit in message and instead in message


@pytest.mark.parametrize(("strategy_name", "needs", "after_step"), [
    ("fsdp", ("loaded",), "load_checkpoint"),
    ("zero1", ("loaded",), "load_checkpoint"),
    ("zero3", ("loaded",), "load_checkpoint"),
    ("fsdp", ("unwrapped",), "compile"),
])
def test_the_example_with_its_needs_declared_runs_where_they_hold(strategy_name, needs,
                                                                  after_step) -> None:
    plan = plan_with(user_step(**EXAMPLE, needs=needs), strategy_name)
    assert where_it_runs(plan.graph, "count_and_freeze").startswith(f"after {after_step}")
    assert plan.order.index(after_step) < plan.order.index("count_and_freeze")


# --explain: the reason for every step a strategy touched -------------------------------------


@pytest.mark.parametrize("strategy_name", [n for n in STRATEGIES if n != "none"])
def test_explain_gives_the_reason_of_every_rewrite_that_touched_a_step(strategy_name) -> None:
    from flexgraph.render import explain_step
    from flexgraph.render._changes import gone_steps

    mine = user_step(**EXAMPLE, needs=("loaded",))  # placed by need where the load moved
    plan = plan_with(mine, strategy_name)
    assert all(r.why for r in plan.rewrites), [r.description for r in plan.rewrites
                                               if not r.why]
    for name, origins in plan.history.items():
        lines = explain_step(plan, name).splitlines()
        for origin in origins:
            at = lines.index(f"  {origin}")
            if origin.action == "placed":  # where and why are in its own line
                assert REASON.search(lines[at]), (name, lines)
            else:
                assert lines[at + 1] == f"    why: {plan.why(origin)}", (name, lines)
    for name in gone_steps(plan):
        assert "    why: " in explain_step(plan, name), name
    placed = plan.origin(mine.name).action == "placed"
    assert placed == (strategy_name in ("zero1", "zero2")), plan.origin(mine.name)
