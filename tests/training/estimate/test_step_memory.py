"""Memory per step: each strategy's allocations, walked along its own plan, add up to its
estimate: setup's peak per rank is ``estimate_setup``'s figure, training's is the peak."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

import pytest
from torch import nn

from flexgraph.cli.plan_cmd import load_config
from flexgraph.core.rewrite import Prune
from flexgraph.render._page_memory import held_by_step
from flexgraph.training.estimate import trains_on
from flexgraph.training.estimate._census import take_census


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 48)
        self.blocks = nn.Sequential(*(nn.Linear(48, 48) for _ in range(3)))
        self.head = nn.Linear(48, 7)


STRATEGIES = {
    "single": "dict(type='SingleDeviceStrategy')",
    "ddp": "dict(type='DDPStrategy')",
    "fsdp": "dict(type='FSDPStrategy')",
    "zero2 fp16": "dict(type='DeepSpeedStrategy', fp16=dict(enabled=True), "
                  "zero_optimization=dict(stage=2))",
    "zero3": "dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))",
    "zero3 bf16": "dict(type='DeepSpeedStrategy', bf16=dict(enabled=True), "
                  "zero_optimization=dict(stage=3))",
}
PEAK = 10**9


def _walk(tmp_path: Path, strategy: str, device: str, loaded: bool):
    config = tmp_path / "cfg.py"
    config.write_text(f"model = dict(type='AnyModel')\nstrategy = {STRATEGIES[strategy]}\n")
    spec = load_config(str(config))
    chosen = spec.resolve_strategy(None)
    pruned = loaded and "init_weights" in chosen.prunable
    plan = spec.plan(chosen, derived=[Prune("init_weights", "covered")] if pruned else ())
    module = import_module(chosen.memory_model)
    census = take_census(_Model())
    options = dict(chosen.memory_options)
    facts = {"world_size": 4, "target_device": device, "weights_loaded": pruned}
    memory = module.estimate_memory(census, world_size=4, amp=None, optimizer_states=2,
                                    **options)
    setup = module.estimate_setup(census, **facts, **options)
    steps = module.estimate_steps(census, memory=memory, **facts, **options)
    candidate = {"peak_bytes": PEAK, "phase": "backward", "steps": {
        "trains_on": trains_on(device), "allocations": [a.as_dict() for a in steps]}}
    held, said = held_by_step(plan.order, candidate)
    optimizer = next(n for n in plan.order if "optim_wrapper" in plan.graph.by_name[n].provides)
    return plan, setup, held, said, plan.order[:plan.order.index(optimizer)]


@pytest.mark.parametrize("loaded", [False, True], ids=["initialised", "loaded"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_the_steps_add_up_to_the_setup_and_the_peak(tmp_path, strategy, device, loaded):
    plan, setup, held, said, before_optimizer = _walk(tmp_path, strategy, device, loaded)
    assert not {a for a in said if a not in plan.order}  # every allocation at a planned step
    for rank, figure in (("rank0", setup.rank0), ("others", setup.others)):
        assert max(held[n][rank, "host"] for n in before_optimizer) == figure, rank
        assert held["train"][rank, trains_on(device)] == PEAK


def test_fsdp_no_rank_holds_the_whole_model_at_any_step_of_setup(tmp_path):
    plan, setup, held, said, before_optimizer = _walk(tmp_path, "fsdp", "cpu", False)
    census = take_census(_Model())
    assert held["build_model"]["rank0", "host"] == 0
    shards = held["materialize"]["rank0", "host"]
    assert shards == held["materialize"]["others", "host"] == census.param_bytes // 4
    assert held["init_weights"]["rank0", "host"] == shards + 8 * census.largest_param
    assert all(held[n]["rank0", "host"] == held[n]["others", "host"] for n in before_optimizer)
    assert any("made from the record" in line for line in said["init_weights"])


def test_zero3_no_rank_holds_the_whole_model_at_init_weights(tmp_path):
    _, setup, held, _, _ = _walk(tmp_path, "zero3", "cpu", False)
    assert held["init_weights"]["rank0", "host"] == held["init_weights"]["others", "host"]
    assert setup.rank0 == setup.others
