"""The FSDP strategy's own checkpoints: sharded directories or one full file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from flexgraph.strategies.fsdp.shards import ROWS
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from flexgraph.training.checkpoint import (
    SHARDED_KEYS,
    CheckpointIO,
    FileCheckpointIO,
    OnRead,
    TorchStateAccess,
    WeightLoader,
    WeightsLoaded,
    full_tensors,
    load_dcp_weights,
    load_into_slices,
    optimizer_keyed_by,
    optimizers_of,
)
from flexgraph.training.errors import CheckpointError, ForeignCheckpointError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    EXTRA_NAME,
    CheckpointFormat,
    dcp_load,
    dcp_problem,
    read_checkpoint_file,
)
from flexgraph.training.runtime import broadcast_from_rank0, rank0_does, this_rank

__all__ = ["DistributedCheckpointIO", "FullStateFileIO", "ShardLoader"]


class ShardLoader(WeightLoader):
    """``load_from`` into FSDP2's shards, each rank reading only what it holds."""

    def load_weights(self, path: Path, model: Any, *, held: CheckpointFormat,
                     on_read: OnRead) -> WeightsLoaded:
        if held is DCP_DIRECTORY:
            return load_dcp_weights(path, model, on_read=on_read)
        return load_into_slices(path, held, model, ROWS, on_read=on_read)


def _wrapper_extras(optim_wrapper: Any) -> dict[str, Any]:
    """What an MMEngine wrapper keeps beside its optimizer (AMP's loss scaler)."""
    scaler = getattr(optim_wrapper, "loss_scaler", None)
    return {"loss_scaler": scaler.state_dict()} if scaler is not None else {}


def _restore_wrapper_extras(optim_wrapper: Any, checkpoint: dict[str, Any]) -> None:
    scaler = getattr(optim_wrapper, "loss_scaler", None)
    if scaler is not None and checkpoint.get("loss_scaler"):
        scaler.load_state_dict(checkpoint["loss_scaler"])


def _write_file(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class DistributedCheckpointIO(ShardLoader, CheckpointIO):
    """Sharded checkpoint directories (``iter_40.dcp/``); rank 0 writes the rest as ``extra.pth``.

    DCP reshards on load, so another world size resumes.
    """

    suffix = ".dcp"
    format = DCP_DIRECTORY

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": TorchStateAccess().model_state(model)}
        if optim_wrapper is not None:
            out["optimizer"] = get_optimizer_state_dict(model, optimizers_of(optim_wrapper))
            out.update(_wrapper_extras(optim_wrapper))
        return out

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        import torch.distributed.checkpoint as dcp

        sharded = {k: checkpoint[k] for k in SHARDED_KEYS if checkpoint.get(k) is not None}
        # Hook extras holding shards (rare) are gathered: extra.pth is rank 0's alone.
        rest = full_tensors({k: v for k, v in checkpoint.items() if k not in sharded})
        dcp.save(sharded, storage_writer=FileSystemWriter(path))
        if this_rank() == 0:
            _write_file(rest, path / EXTRA_NAME)

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        problem = dcp_problem(path)
        if problem is not None:
            raise CheckpointError(problem)
        checkpoint = read_checkpoint_file(path / EXTRA_NAME)
        if not isinstance(checkpoint, dict):
            raise CheckpointError(f"sharded checkpoint {str(path)!r}: its {EXTRA_NAME} holds a "
                                  f"{type(checkpoint).__name__}, not flexgraph's loop state")
        checkpoint = dict(checkpoint)
        template = self.states(model, optim_wrapper)
        sharded = {k: template[k] for k in SHARDED_KEYS if k in template}
        dcp_load(sharded, path)
        checkpoint.update(sharded)
        return checkpoint

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        set_model_state_dict(model, checkpoint["state_dict"],
                             options=StateDictOptions(strict=strict))
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            set_optimizer_state_dict(model, optimizers_of(optim_wrapper), checkpoint["optimizer"])
            _restore_wrapper_extras(optim_wrapper, checkpoint)

    def is_complete(self, path: Path) -> bool:
        return self.incomplete(path) is None

    def incomplete(self, path: Path) -> str | None:
        return dcp_problem(path)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FullStateFileIO(ShardLoader, FileCheckpointIO):
    """One file with the full state, gathered to rank 0, the optimizer's by parameter name."""

    maps_weights = False

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": get_model_state_dict(model, options=_FULL)}
        if optim_wrapper is not None:
            out["optimizer"] = get_optimizer_state_dict(model, optimizers_of(optim_wrapper),
                                                        options=_FULL)
            out.update(_wrapper_extras(optim_wrapper))
        return out

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """Rank 0 reads the file; the other ranks get everything but the states."""
        def read_on_rank0() -> dict[str, Any]:
            read = super(FullStateFileIO, self).read(path)
            if not isinstance(read, dict):
                raise CheckpointError(f"checkpoint {str(path)!r} holds a "
                                      f"{type(read).__name__}, not a checkpoint dict")
            if optimizer_keyed_by(read.get("optimizer")) == "position":
                raise ForeignCheckpointError(
                    f"checkpoint {str(path)!r} is a single-device or DDP checkpoint: its "
                    f"optimizer state numbers the parameters, and FSDP (state_dict_cfg="
                    f"'full') restores one that names them; resume it with --strategy ddp, "
                    f"or start from its weights alone with --load-from {str(path)!r}")
            return read

        checkpoint = rank0_does(read_on_rank0, share_result=False)
        rest = broadcast_from_rank0(
            None if checkpoint is None else
            {k: v for k, v in checkpoint.items() if k not in SHARDED_KEYS})
        return checkpoint if checkpoint is not None else {**rest, "state_dict": {},
                                                          "optimizer": {}}

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                   strict=strict)
        set_model_state_dict(model, checkpoint.get("state_dict") or {}, options=options)
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            set_optimizer_state_dict(model, optimizers_of(optim_wrapper),
                                     checkpoint.get("optimizer") or {}, options=options)
            _restore_wrapper_extras(optim_wrapper, checkpoint)
