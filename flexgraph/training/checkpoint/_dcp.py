"""Checkpoints of sharded models, through ``torch.distributed.checkpoint`` (DCP).

Two IOs for models whose parameters are spread over the ranks (FSDP2's DTensor
shards; anything torch's ``state_dict`` API understands):

* :class:`DistributedCheckpointIO` (``iter_40.dcp/``): every rank writes its own
  shards of the model and the optimizer, in parallel, and reads back only what
  it holds; the checkpoint can be resumed on another world size, because DCP
  reshards on load. The rest of the checkpoint (loop position, schedulers,
  every rank's RNG state, hook extras) is a small ``extra.pth`` that rank 0
  writes beside the shards.
* :class:`FullStateFileIO` (``iter_40.pth``): the full state gathered to rank 0
  and written as one ordinary file, the "full state dict" export that other
  tools (and MMEngine) read. Loading it back, rank 0 reads the file and each
  rank receives only its shard (``broadcast_from_rank0``), so no rank holds the
  whole model twice.

Both load ``load_from`` weights the same way (:func:`load_weights_into_shards`):
a DCP checkpoint shard by shard, a full file from rank 0. Reading is safe as
everywhere in flexgraph (:mod:`flexgraph.training.formats`). DCP's
shard files carry no checksum, so changed bytes inside a shard of the right
length go unnoticed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from flexgraph.training.checkpoint._file import FileCheckpointIO, optimizer_keyed_by
from flexgraph.training.checkpoint._io import NOTHING_READ, CheckpointIO, OnRead
from flexgraph.training.checkpoint._weights import (
    WeightsLoaded,
    load_dcp_weights,
    matching_weights,
)
from flexgraph.training.errors import CheckpointError, ForeignCheckpointError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    EXTRA_NAME,
    dcp_load,
    dcp_problem,
    read_any_checkpoint,
    read_checkpoint_file,
)
from flexgraph.training.runtime import broadcast_from_rank0, rank0_does, this_rank

__all__ = ["SHARDED_KEYS", "DistributedCheckpointIO", "FullStateFileIO",
           "load_weights_into_shards"]

SHARDED_KEYS = ("state_dict", "optimizer")
"""The checkpoint entries DCP writes shard by shard; the rest go into ``extra.pth``."""


def load_weights_into_shards(path: Path, model: torch.nn.Module, *, on_read: OnRead
                             ) -> WeightsLoaded:
    """``load_from`` into a sharded model: no rank holds the whole model twice.

    A DCP checkpoint: each rank reads its own shards. A full file: rank 0 reads
    it (the hooks see it there), and every rank receives its shard of each
    tensor (``set_model_state_dict(..., broadcast_from_rank0=True)``).
    """
    if DCP_DIRECTORY.recognise(path):
        on_read(dict(NOTHING_READ))
        return load_dcp_weights(model, path)
    shapes = {k: tuple(v.shape) for k, v in get_model_state_dict(model).items()}  # global
    checkpoint = rank0_does(lambda: read_any_checkpoint(path), share_result=False)
    checkpoint = checkpoint if checkpoint is not None else dict(NOTHING_READ)
    on_read(checkpoint)
    found = rank0_does(lambda: matching_weights(checkpoint, str(path), shapes,
                                                type(model).__name__), share_result=False)
    weights, left_out = found if found is not None else ({}, None)
    left_out = broadcast_from_rank0(left_out)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    return left_out


# -- the state of a sharded model -----------------------------------------------------------

def _optimizers(optim_wrapper: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside an MMEngine wrapper (several for an OptimWrapperDict)."""
    wrappers = getattr(optim_wrapper, "optim_wrappers", None)
    if wrappers is not None:
        return [w.optimizer for w in wrappers.values()]
    return [optim_wrapper.optimizer]


def _wrapper_extras(optim_wrapper: Any) -> dict[str, Any]:
    """What an MMEngine wrapper keeps beside its optimizer (AMP's loss scaler)."""
    scaler = getattr(optim_wrapper, "loss_scaler", None)
    return {"loss_scaler": scaler.state_dict()} if scaler is not None else {}


def _restore_wrapper_extras(optim_wrapper: Any, checkpoint: dict[str, Any]) -> None:
    scaler = getattr(optim_wrapper, "loss_scaler", None)
    if scaler is not None and checkpoint.get("loss_scaler"):
        scaler.load_state_dict(checkpoint["loss_scaler"])


def _full_tensors(value: Any) -> Any:
    """``value`` with DTensors gathered into plain tensors (a collective, on every rank)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    if isinstance(value, dict):
        return {k: _full_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_full_tensors(v) for v in value)
    return value


def _write_file(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class DistributedCheckpointIO(CheckpointIO):
    """Sharded checkpoint directories: every rank writes and reads its own shards."""

    suffix = ".dcp"
    format = DCP_DIRECTORY

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": get_model_state_dict(model)}
        if optim_wrapper is not None:
            out["optimizer"] = get_optimizer_state_dict(model, _optimizers(optim_wrapper))
            out.update(_wrapper_extras(optim_wrapper))
        return out

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        import torch.distributed.checkpoint as dcp

        sharded = {k: checkpoint[k] for k in SHARDED_KEYS if checkpoint.get(k) is not None}
        # Hook extras holding shards (rare) are gathered: extra.pth is rank 0's alone.
        rest = _full_tensors({k: v for k, v in checkpoint.items() if k not in sharded})
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
            set_optimizer_state_dict(model, _optimizers(optim_wrapper), checkpoint["optimizer"])
            _restore_wrapper_extras(optim_wrapper, checkpoint)

    def load_weights(self, path: Path, model: Any, *, on_read: OnRead) -> WeightsLoaded:
        return load_weights_into_shards(path, model, on_read=on_read)

    def is_complete(self, path: Path) -> bool:
        return self.problem(path) is None

    def problem(self, path: Path) -> str | None:
        if self.foreign_format(path) is not None:
            return super().problem(path)
        return dcp_problem(path)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FullStateFileIO(FileCheckpointIO):
    """One file with the full state, gathered from the shards to rank 0.

    The optimizer state is keyed by parameter name (torch's full optimizer
    state dict), so it loads into any sharding of the same model. Rank 0 reads the
    file into memory (nothing mapped): the states are broadcast from there.
    """

    maps_weights = False

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": get_model_state_dict(model, options=_FULL)}
        if optim_wrapper is not None:
            out["optimizer"] = get_optimizer_state_dict(model, _optimizers(optim_wrapper),
                                                        options=_FULL)
            out.update(_wrapper_extras(optim_wrapper))
        return out

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """Rank 0 reads the file; the other ranks get everything but the states.

        A file rank 0 cannot read raises the same error on every rank; so does
        a single-device or DDP checkpoint (:class:`ForeignCheckpointError`):
        its optimizer state is keyed by position, which torch's full optimizer
        state dict API cannot place (it fails only at the next save).
        """
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

    def load_weights(self, path: Path, model: Any, *, on_read: OnRead) -> WeightsLoaded:
        return load_weights_into_shards(path, model, on_read=on_read)

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                   strict=strict)
        set_model_state_dict(model, checkpoint.get("state_dict") or {}, options=options)
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            set_optimizer_state_dict(model, _optimizers(optim_wrapper),
                                     checkpoint.get("optimizer") or {}, options=options)
            _restore_wrapper_extras(optim_wrapper, checkpoint)
