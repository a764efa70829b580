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

Loading stays safe as everywhere in flexgraph: DCP's own reader unpickles its
``.metadata`` file and ``torch.load``-s non-tensor items with
``weights_only=False``; here the metadata goes through an unpickler that only
admits DCP's metadata classes, and every other item through
``weights_only=True``.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from flexgraph.training.checkpoint_io import CheckpointIO, FileCheckpointIO, rank_of
from flexgraph.training.errors import CheckpointError, UnsafeCheckpointError

__all__ = ["DistributedCheckpointIO", "FullStateFileIO", "load_sharded_model_state"]

EXTRA_NAME = "extra.pth"
SHARDED_KEYS = ("state_dict", "optimizer")


# -- safe reading -------------------------------------------------------------------------

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_METADATA_NAMES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    *(("pathlib", n) for n in ("Path", "PosixPath", "WindowsPath", "PurePosixPath",
                               "PureWindowsPath")),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes, torch dtypes and paths; refuses everything else."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = module in _METADATA_MODULES or (module, name) in _METADATA_NAMES
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True
        if not allowed:
            raise UnsafeCheckpointError(
                f"refused to read DCP metadata: it asks for {module}.{name}, which a "
                f"checkpoint written by torch.distributed.checkpoint never holds")
        return super().find_class(module, name)


class _SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read through :class:`_MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's load planner with non-tensor items read by ``torch.load(weights_only=True)``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def _dcp_load(state: dict[str, Any], path: Path, *, partial: bool = False) -> None:
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state, storage_reader=_SafeReader(path),
                 planner=_SafePlanner(allow_partial_load=partial))
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # DCP wraps each rank's failure in a CheckpointException
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot load the sharded checkpoint {str(path)!r}: {first}") \
            from exc


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
        if rank_of() == 0:
            _write_file(rest, path / EXTRA_NAME)

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        from flexgraph.training.checkpoint import load_checkpoint_file

        if not self.is_complete(path):
            raise CheckpointError(
                f"{str(path)!r} is not a complete sharded checkpoint (it needs DCP's "
                f".metadata and {EXTRA_NAME}); was its save interrupted?")
        checkpoint = dict(load_checkpoint_file(path / EXTRA_NAME))
        template = self.states(model, optim_wrapper)
        sharded = {k: template[k] for k in SHARDED_KEYS if k in template}
        _dcp_load(sharded, path)
        checkpoint.update(sharded)
        return checkpoint

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        set_model_state_dict(model, checkpoint["state_dict"],
                             options=StateDictOptions(strict=strict))
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            set_optimizer_state_dict(model, _optimizers(optim_wrapper), checkpoint["optimizer"])
            _restore_wrapper_extras(optim_wrapper, checkpoint)

    def is_complete(self, path: Path) -> bool:
        return (path.is_dir() and (path / ".metadata").is_file()
                and zipfile.is_zipfile(path / EXTRA_NAME))


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FullStateFileIO(FileCheckpointIO):
    """One file with the full state, gathered from the shards to rank 0.

    The optimizer state is keyed by parameter name (torch's full optimizer
    state dict), so it loads into any sharding of the same model.
    """

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"state_dict": get_model_state_dict(model, options=_FULL)}
        if optim_wrapper is not None:
            out["optimizer"] = get_optimizer_state_dict(model, _optimizers(optim_wrapper),
                                                        options=_FULL)
            out.update(_wrapper_extras(optim_wrapper))
        return out

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        """Rank 0 reads the file; the other ranks get everything but the states."""
        checkpoint = super().read(path) if rank_of() == 0 else None
        rest = _broadcast({k: v for k, v in checkpoint.items() if k not in SHARDED_KEYS}
                          if checkpoint is not None else None)
        return checkpoint if checkpoint is not None else {**rest, "state_dict": {},
                                                          "optimizer": {}}

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                   strict=strict)
        set_model_state_dict(model, checkpoint.get("state_dict") or {}, options=options)
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            set_optimizer_state_dict(model, _optimizers(optim_wrapper),
                                     checkpoint.get("optimizer") or {}, options=options)
            _restore_wrapper_extras(optim_wrapper, checkpoint)


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def load_sharded_model_state(model: torch.nn.Module, path: Path) -> Iterable[str]:
    """Load the model part of a :class:`DistributedCheckpointIO` checkpoint into ``model``.

    Weights only, partially (the checkpoint may lack some of the model's keys,
    as ``load_from`` allows); returns the model keys the checkpoint did not have.
    """
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"{str(path)!r} is a directory but not a sharded (DCP) "
                              f"checkpoint: it has no .metadata")
    metadata = _SafeReader(path).read_metadata()
    saved = {key.removeprefix("state_dict.") for key in metadata.state_dict_metadata
             if key.startswith("state_dict.")}
    current = get_model_state_dict(model)
    wanted = {k: v for k, v in current.items() if k in saved}
    if not wanted:
        raise CheckpointError(
            f"none of the weights in {str(path)!r} match a parameter of "
            f"{type(model).__name__}; is it the right checkpoint?")
    state = {"state_dict": wanted}
    _dcp_load(state, path, partial=True)
    set_model_state_dict(model, state["state_dict"], options=StateDictOptions(strict=False))
    return sorted(set(current) - set(wanted))
