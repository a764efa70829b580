"""MMDetection's SyncNormHook under FSDP: flexgraph's stands in and averages what ranks hold apart.

Two CPU processes (gloo), a model with BatchNorm layers whose running statistics
differ per rank. Sharded by ``fully_shard`` (the norm weights DTensors) or
partitioned by ZeRO-3 (empty parameters), flexgraph's hook averages the
statistics and leaves the shards; on the same model unsharded it gives
MMDetection's own hook's result, bit for bit.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from flexgraph.training.loop._sync_norm import SyncNormHook
from tests.strategies.fsdp.test_shards import free_port

pytestmark = pytest.mark.slow


def _model(rank: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1),
                          nn.BatchNorm2d(4))
    model(torch.randn(2, 3, 8, 8) + rank)  # each rank's own running statistics
    return model


def _worker(rank: int, world: int, port: int, folder: str) -> None:
    import os

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sharded, whole = _model(rank), _model(rank)
        fully_shard(sharded)
        SyncNormHook().before_val_epoch(SimpleNamespace(model=sharded))
        SyncNormHook().before_val_epoch(SimpleNamespace(model=whole))
        saved = {"sharded": dict(sharded.named_buffers()), "whole": whole.state_dict()}
        if importlib.util.find_spec("deepspeed") is not None:
            import deepspeed

            partitioned = _model(rank)
            engine, *_ = deepspeed.initialize(model=partitioned, config={
                "train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                "zero_allow_untested_optimizer": True})
            SyncNormHook().before_val_epoch(SimpleNamespace(model=engine))
            saved["partitioned"] = dict(partitioned.named_buffers())
        try:
            from mmdet.engine.hooks import SyncNormHook as MMDetSyncNormHook
        except ImportError:
            pass
        else:
            theirs = _model(rank)
            MMDetSyncNormHook().before_val_epoch(SimpleNamespace(model=theirs))
            saved["mmdet"] = theirs.state_dict()
        torch.save(saved, f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_norm_statistics_are_averaged_over_sharded_and_whole_models(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    before = [_model(r).state_dict() for r in range(2)]
    mean = (before[0]["1.running_mean"] + before[1]["1.running_mean"]) / 2
    assert not torch.equal(before[0]["1.running_mean"], before[1]["1.running_mean"])
    for saved in ranks:
        assert torch.equal(saved["sharded"]["1.running_mean"], mean)
        for key, value in [*saved["sharded"].items(), *saved.get("partitioned", {}).items()]:
            assert torch.equal(value, saved["whole"][key]), key
        assert torch.equal(saved["whole"]["1.weight"], before[0]["1.weight"])
        for package, key in (("mmdet", "mmdet"), ("deepspeed", "partitioned")):
            assert (key in saved) == (importlib.util.find_spec(package) is not None)
        if "mmdet" in saved:
            assert saved["mmdet"].keys() == saved["whole"].keys()
            for key, value in saved["mmdet"].items():
                assert torch.equal(value, saved["whole"][key]), key


def test_mmdetection_s_hook_is_built_as_flexgraph_s_with_its_priority(make_cfg):
    pytest.importorskip("mmdet", reason="make test-ecosystem installs mmdet")
    from tests.training.training_helpers import build_hooks

    hooks = build_hooks(make_cfg(custom_hooks=[
        dict(type="mmdet.SyncNormHook", priority="LOW")])).hooks
    (built,) = [hook for hook in hooks if "SyncNorm" in type(hook).__name__]
    assert type(built) is SyncNormHook and built.priority == "LOW"
