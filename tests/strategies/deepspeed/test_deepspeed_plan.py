"""The DeepSpeed strategy as a plan and as a config: order, options, what it fills in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mmengine.config import Config

from flexgraph import Move, PlanCheckError, StrategyOptionError, get_strategy, make_plan
from flexgraph.cli.main import main
from flexgraph.training.errors import ConfigError
from flexgraph.training.graph import standard_graph

ROOT = Path(__file__).resolve().parents[3]
SEED = sorted((ROOT / "examples" / "seed").glob("*.py"))


def plan(strategy=None, entry="train", **options):
    strategy = strategy or get_strategy("DeepSpeedStrategy", **options)
    targets = () if entry == "train" else (entry,)
    return make_plan(standard_graph(entry=entry), strategy, targets=targets)


def test_zero3_builds_under_zero_init_loads_into_the_partitions_then_fuses_initialize():
    p = plan(zero_optimization=dict(stage=3))
    order = p.order
    assert order.index("init_weights") < order.index("load_checkpoint") \
        < order.index("deepspeed_initialize") < order.index("resume")
    for fused in ("wrap_model", "build_optim_wrapper"):
        assert fused not in order
    steps = {s.name: s for s in p.steps}
    assert steps["build_model"].params["init_context"] == \
        "flexgraph.strategies.deepspeed.steps:zero_init"
    assert steps["init_weights"].fn_name == \
        "flexgraph.training.steps:init_from_record"
    assert steps["init_weights"].params["place"] == \
        "flexgraph.strategies.deepspeed.partitions:into_partitions"
    assert "cfg" in steps["init_weights"].requires, "it records the one-device setup"
    assert p.origin("deepspeed_initialize").short == "fused by deepspeed #5"
    assert p.origin("load_checkpoint").short == "base"
    assert steps["build_train_step"].fn_name == \
        "flexgraph.strategies.deepspeed.steps:build_train_step"
    assert "follow_init_draws" not in order  # only where init_weights is pruned


def test_zero3_without_init_weights_follows_its_draws_instead():
    from flexgraph import Prune

    strategy = get_strategy("DeepSpeedStrategy", zero_optimization=dict(stage=3))
    assert strategy.prunable == ("init_weights",)
    p = make_plan(standard_graph(), strategy,
                  derived=(Prune("init_weights", "every state_dict entry comes from a file"),))
    order = p.order
    assert "init_weights" not in order
    assert order.index("build_model") < order.index("follow_init_draws") \
        < order.index("load_checkpoint") < order.index("deepspeed_initialize")
    assert get_strategy("DeepSpeedStrategy", zero_optimization=dict(stage=2)).prunable == ()


def test_zero1_loads_through_the_engine_after_it():
    p = plan(zero_optimization=dict(stage=1))
    assert p.order.index("deepspeed_initialize") < p.order.index("load_checkpoint")
    assert str(p.origin("load_checkpoint")).startswith("moved by deepspeed #3")


def test_stages_below_3_build_the_model_normally():
    steps = {s.name: s for s in plan(zero_optimization=dict(stage=1)).steps}
    assert "init_context" not in steps["build_model"].params
    assert steps["init_weights"].fn_name == "flexgraph.training.steps:init_weights"


def test_only_a_tensor_parallel_config_keeps_deepspeeds_shm_all_reduce():
    setup = {s.name: s for s in plan().steps}["setup_env"]
    assert setup.params["tensor_parallel"] is False
    tp = plan(config=dict(tensor_parallel=dict(autotp_size=2)))
    assert {s.name: s for s in tp.steps}["setup_env"].params["tensor_parallel"] is True


def test_a_deepspeed_scheduler_is_fused_into_initialize_too():
    p = plan(config=dict(scheduler=dict(type="WarmupLR", params=dict(warmup_num_steps=10))))
    assert "build_param_schedulers" not in p.order
    initialize = {s.name: s for s in p.steps}["deepspeed_initialize"]
    assert initialize.provides == ("optim_wrapper", "param_schedulers")


def test_keys_override_a_json_config_and_cpu_offload_becomes_offload_optimizer(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"gradient_clipping": 1.0, "zero_optimization": {"stage": 1}}))
    p = plan(config=str(path), zero_optimization=dict(stage=2, cpu_offload=True))
    config = {s.name: s for s in p.steps}["deepspeed_initialize"].params["config"]
    assert config["gradient_clipping"] == 1.0
    assert config["zero_optimization"] == {
        "stage": 2, "offload_optimizer": {"device": "cpu"},
        "reduce_bucket_size": "auto", "allgather_bucket_size": "auto"}


@pytest.mark.parametrize("options, culprit", [
    (dict(fp16=dict(enabled=True), bf16=dict(enabled=True)), "fp16 and bf16"),
    (dict(zero_optimization=dict(stage=4)), "stage=4"),
    (dict(config="/no/such/ds.json"), "does not exist"),
    (dict(zero_optimisation=dict(stage=1)), "zero_optimisation"),
])
def test_bad_options_are_refused_by_name(options, culprit):
    with pytest.raises(StrategyOptionError, match=culprit):
        get_strategy("deepspeed", **options)


def test_loading_before_initialize_is_refused_with_the_reason():
    bad = get_strategy("deepspeed").then(Move("load_checkpoint", before="deepspeed_initialize"))
    with pytest.raises(PlanCheckError, match="load_checkpoint must run after "
                                             "deepspeed_initialize: the engine owns"):
        plan(bad)


def test_zero3_loading_after_initialize_is_refused_with_the_reason():
    bad = get_strategy("deepspeed", zero_optimization=dict(stage=3)).then(
        Move("load_checkpoint", after="deepspeed_initialize"))
    with pytest.raises(PlanCheckError, match="deepspeed_initialize must run after "
                                             "load_checkpoint: under ZeRO-3 the weights"):
        plan(bad)


def test_the_val_entry_keeps_the_engine():
    p = plan(entry="val", zero_optimization=dict(stage=3))
    assert "deepspeed_initialize" in p.order and "resume" not in p.order


@pytest.mark.parametrize("config", SEED, ids=[p.stem for p in SEED])
def test_every_seed_config_plans_on_any_machine(config, capsys):
    assert main(["plan", str(config), "--format", "json"]) == 0, capsys.readouterr().err
    order = [s["name"] for s in json.loads(capsys.readouterr().out)["steps"]]
    if "deepspeed_zero3" in config.stem:  # into the partitions, before the engine
        assert order.index("load_checkpoint") < order.index("deepspeed_initialize")
    elif "deepspeed" in config.stem:
        assert order.index("deepspeed_initialize") < order.index("load_checkpoint")


# -- the config DeepSpeed gets, completed at run time ---------------------------------------

def _fill(config, **cfg):
    from flexgraph.strategies.deepspeed.engine import fill_config

    base = dict(train_dataloader=dict(batch_size=8), optim_wrapper=dict(optimizer={}))
    base.update(cfg)
    return fill_config(config, cfg=Config(base), world_size=2, numel=160_000_000)


def test_batch_sizes_clipping_and_accumulation_come_from_the_config():
    config, filled = _fill({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                                  "stage3_max_live_parameters": "auto"}},
                           optim_wrapper=dict(clip_grad=dict(max_norm=1.0),
                                              accumulative_counts=4))
    assert config["train_micro_batch_size_per_gpu"] == 8
    assert config["gradient_accumulation_steps"] == 4 and config["train_batch_size"] == 64
    assert config["gradient_clipping"] == 1.0
    assert config["zero_optimization"]["reduce_bucket_size"] == 10_000_000  # params / 16
    assert config["zero_optimization"]["stage3_max_live_parameters"] == 20_000_000
    assert filled["train_batch_size"] == 64


def test_no_clip_grad_means_no_clipping_not_deepspeeds_default_of_one():
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    assert GRADIENT_CLIPPING_DEFAULT != 0, "DeepSpeed clips unless told otherwise"
    config, filled = _fill({})
    assert config["gradient_clipping"] == 0.0 and filled["gradient_clipping"] == 0.0
    assert _fill({"gradient_clipping": 2.0})[0]["gradient_clipping"] == 2.0


def test_what_the_user_set_is_never_overwritten_and_a_contradiction_is_named():
    config, _ = _fill({"train_micro_batch_size_per_gpu": 8, "train_batch_size": 16,
                       "zero_optimization": {"reduce_bucket_size": 12345}})
    assert config["train_batch_size"] == 16
    assert config["zero_optimization"]["reduce_bucket_size"] == 12345
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=4 contradicts "
                                          "train_dataloader.batch_size"):
        _fill({"train_micro_batch_size_per_gpu": 4})
    with pytest.raises(ConfigError, match="train_batch_size=100 contradicts"):
        _fill({"train_batch_size": 100})
    with pytest.raises(ConfigError, match="global L2 norm"):
        _fill({}, optim_wrapper=dict(clip_grad=dict(max_norm=1.0, norm_type=1)))


def test_zero_plus_plus_hpz_auto_is_the_processes_per_node(monkeypatch):
    """DeepSpeed's hybrid sharding: a secondary partition of stage 3 within each node."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # 2 ranks: 2 "nodes" of 1
    config, filled = _fill({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": "auto"}})
    assert config["zero_optimization"]["zero_hpz_partition_size"] == 1
    assert filled["zero_optimization.zero_hpz_partition_size"] == 1
    with pytest.raises(ConfigError, match="zero_hpz_partition_size=3 does not divide the world "
                                          "size 2"):
        _fill({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}})


@pytest.mark.parametrize(("zero", "culprit"), [
    ({"stage": 2, "zero_hpz_partition_size": 8}, "needs zero_optimization.stage=3, not 2"),
    ({"stage": 3, "zero_hpz_partition_size": "node"}, "must be a whole number of ranks"),
])
def test_zero_plus_plus_hpz_outside_its_meaning_is_refused(zero, culprit):
    with pytest.raises(StrategyOptionError, match=culprit):
        get_strategy("DeepSpeedStrategy", zero_optimization=zero)


def test_inputs_to_half_casts_dict_keys_positions_and_nested_tensors():
    import torch
    from flexgraph.strategies.deepspeed.engine import cast_inputs

    data = {"inputs": [torch.ones(2), torch.ones(2)], "labels": torch.tensor([1, 2])}
    by_key = cast_inputs(data, ["inputs"], torch.bfloat16)
    assert [t.dtype for t in by_key["inputs"]] == [torch.bfloat16] * 2
    assert by_key["labels"].dtype == torch.int64, "integer tensors keep their type"
    by_position = cast_inputs(data, [0], torch.float16)  # MMEngine configs that say [0]
    assert by_position["inputs"][0].dtype == torch.float16
    pair = cast_inputs((torch.ones(1), torch.ones(1)), [1], torch.float16)
    assert [t.dtype for t in pair] == [torch.float32, torch.float16]
    assert cast_inputs(data, ["inputs"], None) is data, "fp32: nothing to cast"


def test_unset_inputs_to_half_casts_every_floating_tensor_and_an_empty_list_none():
    import torch
    from flexgraph.strategies.deepspeed.engine import cast_inputs

    data = {"inputs": [torch.ones(2)], "target": torch.ones(2), "labels": torch.tensor([1])}
    every = cast_inputs(data, None, torch.bfloat16)
    assert every["inputs"][0].dtype == every["target"].dtype == torch.bfloat16
    assert every["labels"].dtype == torch.int64
    assert cast_inputs(data, [], torch.bfloat16) is data, "[]: the user cast nothing"
    assert cast_inputs(data, None, None) is data, "fp32: nothing to cast"


def test_stale_op_build_locks_are_found_and_fresh_ones_left_alone(tmp_path, monkeypatch):
    import os
    import time

    from flexgraph.strategies.deepspeed.engine import STALE_LOCK_SECONDS, stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    now = time.time()
    for op, age in (("deepspeed_shm_comm", 2 * STALE_LOCK_SECONDS), ("fused_adam", 30)):
        (tmp_path / op).mkdir()
        (tmp_path / op / "lock").touch()
        os.utime(tmp_path / op / "lock", (now - age, now - age))
    (tmp_path / "fused_adam" / "fused_adam.so").touch()
    found = stale_build_locks(now)
    assert [(lock.parent.name, round(age)) for lock, age in found] == [
        ("deepspeed_shm_comm", 2 * STALE_LOCK_SECONDS)], "a build in progress is not stale"


@pytest.mark.parametrize(("amp", "section"), [
    (dict(dtype="bfloat16"), {"bf16": {"enabled": True}}),
    (dict(loss_scale=512.0), {"fp16": {"enabled": True, "loss_scale": 512.0}}),
    (dict(), {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                       "loss_scale_window": 2000, "hysteresis": 1}}),
    (dict(dtype="float16", loss_scale=dict(init_scale=2.0 ** 10, growth_interval=100)),
     {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 10,
               "loss_scale_window": 100, "hysteresis": 1}}),
])
def test_an_amp_optim_wrapper_s_precision_becomes_deepspeed_s(amp, section):
    """torch's GradScaler defaults, where AmpOptimWrapper's dynamic scaling starts."""
    config, filled = _fill({}, optim_wrapper=dict(type="AmpOptimWrapper", optimizer={}, **amp))
    (name, expected), = section.items()
    assert config[name] == expected and filled[name] == expected, "and logged as filled in"
    assert _fill({name: {"enabled": True, "loss_scale": 8}},
                 optim_wrapper=dict(type="AmpOptimWrapper", optimizer={}, **amp)
                 )[0][name] == {"enabled": True, "loss_scale": 8}, "the strategy's wins"


def test_amp_settings_deepspeed_cannot_honour_are_refused_by_name():
    with pytest.raises(ConfigError, match="bf16 contradicts optim_wrapper's AmpOptimWrapper "
                                          r"\(fp16\)"):
        _fill({"bf16": {"enabled": True}}, optim_wrapper=dict(type="AmpOptimWrapper"))
    with pytest.raises(StrategyOptionError, match="loss_scale.*growth_factor"):
        _fill({}, optim_wrapper=dict(type="AmpOptimWrapper",
                                     loss_scale=dict(growth_factor=3.0)))
    with pytest.raises(StrategyOptionError, match="dtype='float32'"):
        _fill({}, optim_wrapper=dict(type="AmpOptimWrapper", dtype="float32"))


def test_the_plan_shows_what_an_amp_optim_wrapper_becomes(tmp_path, capsys):
    config = tmp_path / "amp.py"
    config.write_text(f"_base_ = [{str(ROOT / 'examples' / 'quickstart.py')!r}]\n"
                      "optim_wrapper = dict(type='AmpOptimWrapper', loss_scale=512.0, "
                      "optimizer=dict(type='SGD', lr=0.1))\n")
    said = 'optim_wrapper\'s AmpOptimWrapper becomes DeepSpeed\'s fp16: {"enabled": true, ' \
           '"loss_scale": 512.0}'
    assert main(["plan", str(config), "--strategy", "deepspeed"]) == 0
    assert f"deepspeed_initialize: {said}" in capsys.readouterr().out.splitlines()
    assert main(["plan", str(config), "--strategy", "deepspeed", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == {"deepspeed_initialize": said}
    for other in (["--strategy", "ddp"], ["--cfg-options", "strategy.type=DeepSpeedStrategy",
                                          "strategy.fp16.enabled=True"]):
        assert main(["plan", str(config), "--format", "json", *other]) == 0
        assert "notes" not in json.loads(capsys.readouterr().out), "the strategy's own wins"


def test_keys_deepspeed_s_wrapper_does_not_take_are_named_to_be_dropped():
    from flexgraph.strategies.deepspeed.options import wrapper_options

    taken, dropped = wrapper_options(dict(type="DeepSpeedOptimWrapper", optimizer={},
                                          loss_scale="dynamic", dtype="bfloat16"))
    assert dropped == ["dtype", "loss_scale"] and set(taken) == {"type", "optimizer"}
    assert wrapper_options(dict(type="AmpOptimWrapper", optimizer={}, loss_scale=8))[1] == []
    with pytest.raises(StrategyOptionError, match="optim_wrapper.type='ApexOptimWrapper'"):
        wrapper_options(dict(type="ApexOptimWrapper"))
