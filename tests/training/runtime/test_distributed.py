"""Two CPU processes (gloo): rank 0 writes, every rank's RNG state is saved and restored."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from flexgraph.training.formats import read_checkpoint_file
from tests.training.training_helpers import ddp_worker

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_training_checkpoints_every_rank(tmp_path):
    work = tmp_path / "work"
    mp.spawn(ddp_worker, args=(2, _free_port(), str(work), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    assert ranks[0]["wrapped"] == "DistributedDataParallel"
    for key, value in ranks[0]["model"].items():  # DDP kept the replicas identical
        assert torch.equal(value, ranks[1]["model"][key])
    # each rank trained on its half: 40 samples / 2 ranks / batch 4 = 5 iterations/epoch
    assert ranks[0]["result"]["iter"] == 15

    checkpoint = read_checkpoint_file(work / "epoch_3.pth")
    assert checkpoint["meta"]["world_size"] == 2
    states = checkpoint["rng_states"]
    assert len(states) == 2 and not torch.equal(states[0]["torch"], states[1]["torch"])
    assert all("module." not in key for key in checkpoint["state_dict"])
    for rank in range(2):  # resume hands each rank its own state
        assert torch.equal(ranks[rank]["resumed_rng"], states[rank]["torch"])
    assert sorted(p.name for p in work.glob("*.pth")) == ["epoch_1.pth", "epoch_2.pth",
                                                          "epoch_3.pth"]


def _buffers_worker(rank: int, world: int, port: int, folder: str) -> None:
    import os

    import torch.distributed as dist

    from flexgraph.training.runtime import broadcast_buffers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = torch.nn.BatchNorm1d(3)
        model.register_buffer("mask", torch.tensor([rank == 1, rank == 0, False]))
        model.running_mean.fill_(float(rank))
        broadcast_buffers(model, rank=1)
        torch.save(dict(model.named_buffers()), f"{folder}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_takes_the_source_ranks_buffers_bool_ones_too(tmp_path):
    mp.spawn(_buffers_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        buffers = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert buffers["mask"].dtype == torch.bool
        assert buffers["mask"].tolist() == [True, False, False]
        assert buffers["running_mean"].tolist() == [1.0, 1.0, 1.0]
