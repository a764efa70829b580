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
