"""``load_from`` into ZeRO-3's partitions before the engine, on two CPU processes (gloo).

The model of :mod:`tests.strategies.fsdp.test_shards` (elements that do not
split evenly, a bool buffer), built under ``deepspeed.zero.Init``, loaded from
the same files: each rank reads its own elements of a ``torch.save`` zip or a
safetensors file, and receives them from rank 0 for torch's legacy format.
Gathered, every parameter holds the file's values on every rank; the setup's
buffers travel from rank 0 too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from flexgraph.training.formats import format_of
from tests.strategies.fsdp.test_shards import (
    FILES,
    Masked,
    assert_loaded,
    free_port,
    write_files,
)

pytest.importorskip("deepspeed")

pytestmark = pytest.mark.slow


def _load_worker(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      DS_ACCELERATOR="cpu")
    import deepspeed
    import torch.distributed as dist
    from flexgraph.strategies.deepspeed.checkpoint import DeepSpeedCheckpointIO
    from flexgraph.strategies.deepspeed.steps import _leave_out_shm_all_reduce

    _leave_out_shm_all_reduce(deepspeed)
    deepspeed.init_distributed(dist_backend="gloo")
    try:
        with deepspeed.zero.Init(config_dict_or_path={
                "train_batch_size": world, "zero_optimization": {"stage": 3}}):
            model = Masked()
        found = {}
        for name in FILES:
            with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0), \
                    torch.no_grad():  # each file loads into zeros
                for tensor in model.state_dict().values():
                    tensor.zero_()
            path = Path(folder) / name
            seen: list[list[str]] = []
            loaded = DeepSpeedCheckpointIO().load_weights(
                path, model, held=format_of(path),
                on_read=lambda read, seen=seen: seen.append(sorted(read)))
            local = model.fc.weight.ds_tensor.numel()
            with deepspeed.zero.GatheredParameters(list(model.parameters())):
                state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            found[name] = (state, loaded, seen, local)
        torch.save(found, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_ends_with_the_files_values_read_or_received_as_partitions(tmp_path):
    weights = write_files(tmp_path)
    mp.spawn(_load_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    assert_loaded(tmp_path, weights, local=(8, 8))  # 15 elements: 8 + 7, the last padded
