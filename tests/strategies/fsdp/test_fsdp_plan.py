"""The FSDP strategy as a plan: its order, its options, and the orders it refuses."""

from __future__ import annotations

import pytest

from flexgraph import (
    Configure,
    Move,
    PlanCheckError,
    Prune,
    Remove,
    StrategyOptionError,
    get_strategy,
    make_plan,
)
from flexgraph.training.graph import standard_graph

SIZE_POLICY = dict(type="torch.distributed.fsdp.wrap.size_based_auto_wrap_policy",
                   min_num_params=1e7)


def plan(strategy=None, cfg=None, entry="train", **options):
    strategy = strategy or get_strategy("fsdp", **options)
    targets = () if entry == "train" else (entry,)
    return make_plan(standard_graph(cfg, entry=entry), strategy, targets=targets)


def test_fsdp_shards_on_meta_then_initialises_into_the_shards_then_loads_into_them():
    order = plan().order
    assert order[:7] == ("setup_env", "build_model", "fully_shard", "materialize",
                         "init_weights", "build_hooks", "build_checkpointer")
    assert order.index("load_checkpoint") < order.index("build_optim_wrapper")
    steps = {s.name: s for s in plan().steps}
    assert steps["build_model"].params == {"device": "meta"}, "no rank builds the model whole"
    assert steps["fully_shard"].fn_name == "flexgraph.strategies.fsdp.steps:shard"
    assert steps["init_weights"].fn_name == "flexgraph.training.steps:init_from_record"
    assert steps["init_weights"].params == {
        "place": "flexgraph.strategies.fsdp.steps:scatter_rows", "source_rank": 0}
    assert "cfg" in steps["init_weights"].requires, "it records the one-device setup"
    assert steps["load_checkpoint"].fn_name == "flexgraph.training.steps:load_checkpoint", \
        "the standard step: it loads through the checkpointer's IO, which the strategy sets"
    assert "checkpointer" in steps["load_checkpoint"].requires
    assert steps["build_checkpointer"].params["io"].endswith(":DistributedCheckpointIO")


def test_the_plan_says_which_rewrite_placed_fully_shard_and_moved_init():
    p = plan()
    assert str(p.origin("fully_shard")) == "inserted by fsdp #3: insert fully_shard after " \
                                           "build_model"
    assert str(p.origin("init_weights")) == "moved by fsdp #7: move init_weights after " \
                                            "materialize, when init_weights is planned"
    assert str(p.origin("load_checkpoint")) == "configured by fsdp #9: configure " \
                                               "load_checkpoint: checks every_parameter_set"


def test_checkpointing_then_compile_then_shard_then_init():
    p = plan(cfg={"compile": True}, activation_checkpointing={})
    order = p.order
    assert order.index("activation_checkpointing") < order.index("compile") \
        < order.index("fully_shard") < order.index("materialize") < order.index("init_weights")
    assert p.origin("compile").short == "moved by fsdp #5"
    assert "compile" not in plan().order, "compile is only moved when the config asks for it"


def test_activation_checkpointing_true_checkpoints_the_wrap_units_and_false_nothing():
    steps = {s.name: s for s in plan(activation_checkpointing=True).steps}
    assert steps["activation_checkpointing"].params["options"] == {}
    assert "activation_checkpointing" not in plan(activation_checkpointing=False).order


@pytest.mark.parametrize("how", ["skip_init_weights", "pruned"])
def test_without_init_weights_no_rank_builds_the_whole_model(how):
    """skip_init_weights=True, or a run whose files cover the model (a derived prune)."""
    if how == "pruned":
        p = make_plan(standard_graph(), get_strategy("fsdp"),
                      derived=[Prune("init_weights", "every state_dict entry comes from x")])
        assert [r.description for r in p.rewrites[:1]] == [
            "prune init_weights (every state_dict entry comes from x)"]
    else:
        p = plan(skip_init_weights=True)
    order = p.order
    assert "init_weights" not in order
    assert order[:5] == ("setup_env", "build_model", "fully_shard", "materialize",
                         "build_hooks")
    assert order.index("materialize") < order.index("load_checkpoint")
    steps = {s.name: s for s in p.steps}
    assert steps["build_model"].params == {"device": "meta"}
    assert steps["fully_shard"].fn_name == "flexgraph.strategies.fsdp.steps:shard"
    assert "source_rank" not in steps["fully_shard"].params


def test_fsdp_lets_a_run_prune_init_weights():
    assert get_strategy("fsdp").prunable == ("init_weights",)


def test_mmengine_options_map_onto_fully_shard():
    p = plan(model_wrapper=dict(auto_wrap_policy=SIZE_POLICY, sharding_strategy="SHARD_GRAD_OP",
                                mixed_precision=dict(param_dtype="bfloat16",
                                                     reduce_dtype="float32"),
                                use_orig_params=True))
    params = {s.name: s for s in p.steps}["fully_shard"].params
    assert params == {"auto_wrap_policy": SIZE_POLICY, "reshard_after_forward": False,
                      "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
                      "cpu_offload": False}
    full = {s.name: s for s in plan(state_dict_cfg="full").steps}
    assert full["build_checkpointer"].params["io"].endswith(":FullStateFileIO")


@pytest.mark.parametrize(("wrapper", "mesh", "reshard"), [
    (dict(sharding_strategy="HYBRID_SHARD"), "nodes x processes per node", True),
    (dict(sharding_strategy="ShardingStrategy._HYBRID_SHARD_ZERO2", device_mesh=[2, 8]),
     (2, 8), False),
])
def test_hybrid_sharding_shows_its_mesh_in_the_plan(wrapper, mesh, reshard):
    """Replicate across nodes, shard within one: sized by the launch, or by the config."""
    params = {s.name: s for s in plan(model_wrapper=wrapper).steps}["fully_shard"].params
    assert (params["hybrid_mesh"], params["reshard_after_forward"]) == (mesh, reshard)


@pytest.mark.parametrize("options, culprit", [
    (dict(model_wrapper=dict(backward_prefetch="BACKWARD_PRE")), "model_wrapper.backward_prefetch"),
    (dict(model_wrapper=dict(sharding_strategy="NO_SHARD")), "use DDPStrategy"),
    (dict(model_wrapper=dict(sharding_strategy="HYBRID_SHARDS")), "use one of FULL_SHARD"),
    (dict(model_wrapper=dict(device_mesh=(2, 2))), "device_mesh shapes a hybrid mesh"),
    (dict(model_wrapper=dict(sharding_strategy="HYBRID_SHARD", device_mesh=4)),
     "device_mesh=4 must be"),
    (dict(model_wrapper=dict(mixed_precision=dict(buffer_dtype="float16"))),
     "mixed_precision.buffer_dtype"),
    (dict(model_wrapper=dict(use_orig_params=False)), "use_orig_params=False"),
    (dict(state_dict_cfg="sharded"), "state_dict_cfg='sharded'"),
    (dict(skip_init_weights="yes"), "skip_init_weights"),
    (dict(no_such_option=1), "no_such_option"),
])
def test_options_without_an_fsdp2_meaning_are_refused_by_name(options, culprit):
    with pytest.raises(StrategyOptionError, match=culprit.replace("(", r"\(")):
        get_strategy("FSDPStrategy", **options)


def test_an_optimizer_built_before_sharding_is_refused_with_the_reason():
    # Legal as a graph: a consumer ordered before an updater reads the model as it was.
    bad = get_strategy("fsdp").then(Move("build_optim_wrapper", before="fully_shard"))
    with pytest.raises(PlanCheckError, match="build_optim_wrapper must run after fully_shard: "
                                             "an optimizer built before sharding"):
        plan(bad)


def test_weights_initialised_before_the_shards_have_storage_are_refused():
    bad = get_strategy("fsdp").then(Move("init_weights", before="materialize"))
    with pytest.raises(PlanCheckError, match="init_weights must run after materialize: "
                                             "init_weights writes each rank's rows"):
        plan(bad)


def test_loading_before_the_shards_exist_is_refused():
    bad = get_strategy("fsdp", skip_init_weights=True).then(
        Move("load_checkpoint", before="materialize"))
    with pytest.raises(PlanCheckError, match="load_checkpoint must run after materialize"):
        plan(bad)


@pytest.mark.parametrize("skip", [True, False])
def test_what_nothing_initialised_is_refused_after_the_load(skip):
    every_set = "flexgraph.strategies.fsdp.contracts:every_parameter_set"
    p = plan(get_strategy("fsdp", skip_init_weights=skip))
    assert every_set in p.graph.step("load_checkpoint").contracts


def test_the_val_entry_is_cut_after_the_rewrites_and_keeps_the_sharded_loader():
    p = plan(entry="val")
    assert p.order[-1] == "val"
    for needed in ("fully_shard", "init_weights", "load_checkpoint"):
        assert needed in p.order
    for dropped in ("build_optim_wrapper", "resume", "train"):
        assert dropped not in p.order
    assert "build_optim_wrapper" not in p.base_order, "the base column is cut the same way"


def test_user_rewrites_after_fsdp_keep_its_checks():
    ok = get_strategy("fsdp").then(Configure("build_model", {"init_options": {}}))
    assert plan(ok).order[2] == "fully_shard"


def test_init_weights_removed_after_fsdp_leaves_the_check_of_what_nothing_set():
    """Precedes(materialize, init_weights) guards the order when init_weights is planned;
    without it, a contract of load_checkpoint refuses the parameters the files did not set."""
    p = plan(get_strategy("fsdp").then(Remove("init_weights")))
    assert "init_weights" not in p.order
    assert ("flexgraph.strategies.fsdp.contracts:every_parameter_set"
            in p.graph.step("load_checkpoint").contracts)
