"""The eight setup bugs as plain PyTorch / DeepSpeed code, two ranks over gloo, one launch.

Run by ``torch.distributed.run --nproc-per-node 2 plain_scripts.py OUT``: each
function does what the published bug did, on a small MLP, and returns what a
user would not see without looking (weights, dtypes, elements each rank holds).
Rank 0 writes them all to ``OUT`` as JSON; test_setup_bugs.py reads them.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

os.environ.setdefault("DS_ACCELERATOR", "cpu")
CONFIG = {"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
          "steps_per_print": 10**9}


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def saved_weights() -> dict[str, torch.Tensor]:
    return mlp(seed=1).state_dict()


def same(model: nn.Module, weights: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


def _deepspeed():
    import deepspeed

    builder = deepspeed.accelerator.get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:  # an op ZeRO never calls; building it takes minutes on a CPU
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    return deepspeed


def megatron_lm_6087() -> dict:
    """Weights loaded after wrapping, into the wrapper, without strict: nothing loads."""
    model = mlp()
    wrapped = nn.parallel.DistributedDataParallel(model)
    result = wrapped.load_state_dict(saved_weights(), strict=False)
    return {"loaded": same(model, saved_weights()), "missing": len(result.missing_keys)}


def megatron_bridge_3397() -> dict:
    """Weights loaded into the module past the engine: the optimizer's masters stay old."""
    deepspeed = _deepspeed()
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer,
                                      config={**CONFIG, "zero_optimization": {"stage": 1}})
    engine.module.load_state_dict(saved_weights())
    loaded_before_step = same(engine.module, saved_weights())
    engine.backward(engine(torch.ones(2, 8)).sum())
    engine.step()  # lr 0: the weights must stay what was loaded
    return {"loaded_before_step": loaded_before_step,
            "loaded_after_step": same(engine.module, saved_weights())}


def _held(model: nn.Module) -> int:
    return sum(getattr(p, "ds_tensor", p).numel() for p in model.parameters())


def roblox_fai_rl_66() -> dict:
    """ZeRO-3's config made after the model: every rank builds, and holds, all of it."""
    deepspeed = _deepspeed()
    model = mlp()  # built before the ZeRO-3 config exists: no zero.Init
    held = _held(model)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(
        model.parameters(), lr=0.1), config={**CONFIG, "zero_optimization": {"stage": 3}})
    engine.backward(engine(torch.ones(2, 8)).sum())
    engine.step()
    return {"held_before_engine": held, "total": sum(p.numel() for p in mlp().parameters()),
            "trained": True}


def deepspeed_8084() -> dict:
    """zero.Init under the group it found before the ranks' group existed: each rank's own."""
    deepspeed = _deepspeed()
    alone = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    with deepspeed.zero.Init(config_dict_or_path={**CONFIG, "zero_optimization": {"stage": 3}},
                             data_parallel_group=alone):
        model = mlp()
    return {"held": _held(model), "total": sum(p.ds_numel for p in model.parameters())}


def accelerate_4021() -> dict:
    """Rank 0's state-dict snapshot, taken before the fp32 upcast, broadcast to the others."""
    model = mlp().to(torch.bfloat16)
    snapshot = model.state_dict()  # before the upcast: bf16
    model.float()
    received = {}
    for name, value in model.state_dict().items():
        tensor = snapshot[name].clone() if dist.get_rank() == 0 else torch.empty_like(value)
        dist.broadcast(tensor, src=0)  # rank 0 sends bf16 bytes, the others read fp32
        received[name] = tensor
    expected = mlp().to(torch.bfloat16).float().state_dict()
    return {"rank_matches_source": all(torch.equal(received[k].float(), expected[k])
                                       for k in expected)}


def _forward_dtype(model: nn.Module) -> str:
    seen = []
    handle = model[0].register_forward_hook(lambda m, i, o: seen.append(str(m.weight.dtype)))
    model(torch.ones(2, 8, dtype=torch.bfloat16))
    handle.remove()
    return seen[0]


def accelerate_3979() -> dict:
    """The fp32 upcast applied to the FSDP2 shards after fully_shard: a no-op in forward."""
    from torch.distributed.fsdp import fully_shard

    model = mlp().to(torch.bfloat16)
    fully_shard(model)
    for param in model.parameters():
        param.data = param.data.float()  # the upcast, after wrapping
    return {"forward_dtype": _forward_dtype(model)}


def ms_swift_9982() -> dict:
    """cpu_ram_efficient_loading asked for and not applied: every rank loads the whole file."""
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    model.load_state_dict(saved_weights())  # on every rank, not rank 0 alone
    held = sum(p.numel() for p in model.parameters() if p.device.type != "meta")
    fully_shard(model)
    return {"held_before_sharding": held, "total": sum(p.numel() for p in mlp().parameters())}


def accelerate_fsdp2_optimizer_first() -> dict:
    """The optimizer built before fully_shard holds the old tensors: training changes nothing."""
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    fully_shard(model)
    before = [p.full_tensor().clone() for p in model.parameters()]
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    after = [p.full_tensor() for p in model.parameters()]
    return {"changed": any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))}


BUGS = (megatron_lm_6087, megatron_bridge_3397, roblox_fai_rl_66, deepspeed_8084,
        accelerate_4021, accelerate_3979, ms_swift_9982, accelerate_fsdp2_optimizer_first)


def main() -> None:
    dist.init_process_group("gloo")
    results = {}
    for bug in BUGS:
        try:
            results[bug.__name__] = bug()
        except Exception as exc:  # recorded: the test says which and why
            results[bug.__name__] = {"error": f"{type(exc).__name__}: {exc}"}
        dist.barrier()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, results)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
