"""FSDP's shards: storage for a model built on the meta device, and ``load_from`` into them.

The load runs on two CPU processes (gloo): a model whose rows do not split
evenly, with a bool buffer, loaded from a ``torch.save`` zip and a safetensors
file (each rank reads its own rows) and from torch's legacy format (rank 0
reads, each rank receives its rows): every rank ends with the file's values.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from flexgraph.strategies.fsdp.checkpoint import DistributedCheckpointIO
from flexgraph.strategies.fsdp.shards import materialize_module, uninitialised_parameters
from torch import nn

from flexgraph.training.formats import format_of
from flexgraph.training.runtime import parameters_on_meta
from tests.training.runtime.test_materialize import NormNet


def test_materialize_gives_storage_restores_buffers_and_leaves_every_weight_to_a_loader():
    with parameters_on_meta():
        model = NormNet(bare=True)
    materialize_module(model, "cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert model.table.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert model.bn.running_var.tolist() == [1.0] * 4, "buffers keep their built values"
    assert sorted(uninitialised_parameters(model)) == ["bn.bias", "bn.weight", "fc.bias",
                                                       "fc.weight", "scale"]
    model.load_state_dict(NormNet(bare=True).state_dict())
    assert uninitialised_parameters(model) == []


class Masked(nn.Module):
    """Rows that split 2 + 1 over two ranks, a bool buffer and a float one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.out = nn.Linear(3, 2, bias=False)
        self.register_buffer("mask", torch.zeros(3, dtype=torch.bool))
        self.register_buffer("scale", torch.ones(3))


FILES = ("weights.pth", "weights.safetensors", "legacy.pth")


def write_files(folder: Path) -> dict[str, torch.Tensor]:
    """The files every rank loads, and the values they hold (``out.bias`` the model lacks,
    ``out.weight`` the files lack)."""
    from safetensors.torch import save_file

    torch.manual_seed(1)
    weights = {k: v for k, v in Masked().state_dict().items() if k != "out.weight"}
    weights["mask"] = torch.tensor([True, False, True])
    weights["scale"] = torch.tensor([2.0, 3.0, 4.0])
    weights["out.bias"] = torch.ones(2)
    torch.save({"state_dict": weights}, folder / "weights.pth")
    save_file(weights, str(folder / "weights.safetensors"))
    torch.save({"state_dict": weights}, folder / "legacy.pth",
               _use_new_zipfile_serialization=False)
    return weights


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _whole(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in state.items()}


def _load_worker(rank: int, world: int, port: int, folder: str) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = Masked()
        fully_shard(model)
        found = {}
        for name in FILES:
            with torch.no_grad():  # each file loads into zeros
                for tensor in model.state_dict().values():
                    tensor.zero_()
            path = Path(folder) / name
            seen: list[list[str]] = []
            loaded = DistributedCheckpointIO().load_weights(
                path, model, held=format_of(path),
                on_read=lambda read, seen=seen: seen.append(sorted(read)))
            local = model.fc.weight.to_local().shape[0]
            found[name] = (_whole(model.state_dict()), loaded, seen, local)
        torch.save(found, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def assert_loaded(folder: Path, weights: dict[str, torch.Tensor], local: tuple[int, ...]
                  ) -> None:
    """Every rank (``rank<R>.pt``) ended each load with the files' values; ``local``: how
    many elements (rows) of ``fc.weight`` each rank holds."""
    ranks = [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for name in FILES:
        for rank, found in enumerate(ranks):
            state, loaded, seen, held = found[name]
            assert held == local[rank]
            for key, value in weights.items():
                if key in state:
                    assert torch.equal(state[key], value), (name, rank, key)
            assert state["mask"].dtype == torch.bool
            assert torch.equal(state["out.weight"], torch.zeros(2, 3)), "not in the files"
            assert loaded.missing == ("out.weight",) and loaded.unexpected == ("out.bias",)
            assert len(seen) == 1
        assert ranks[0][name][2] == [["state_dict"]]
    # a mapped file: every rank's hooks see it; the legacy one: rank 0 alone reads it
    assert ranks[1]["weights.pth"][2] == [["state_dict"]]
    assert ranks[1]["legacy.pth"][2] == [["meta", "state_dict"]]


@pytest.mark.slow
def test_every_rank_ends_with_the_files_values_read_or_received_as_rows(tmp_path):
    weights = write_files(tmp_path)
    mp.spawn(_load_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    assert_loaded(tmp_path, weights, local=(2, 1))  # the rows split 2 + 1
