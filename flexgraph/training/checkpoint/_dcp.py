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

A damaged checkpoint is named with what is wrong with it (:func:`dcp_problem`):
a file or a directory without ``.metadata``, a ``.metadata`` that does not
unpickle, a shard file missing or shorter than the metadata says (truncated),
a missing or damaged ``extra.pth``. DCP's shard files carry no checksum, so
changed bytes inside a shard of the right length go unnoticed.
"""

from __future__ import annotations

import io
import os
import pickle
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

from flexgraph.training.checkpoint._io import CheckpointIO, FileCheckpointIO, rank_of
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
        try:
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except UnsafeCheckpointError:
            raise
        except Exception as exc:  # a truncated or corrupt pickle fails in many ways
            raise CheckpointError(
                f"sharded checkpoint {str(self.path)!r} is corrupt: its .metadata cannot be "
                f"read ({type(exc).__name__}: {str(exc).strip()[:160]})") from exc
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


def _root_cause(exc: BaseException) -> BaseException:
    """The first rank's own error inside DCP's ``CheckpointException`` (else ``exc``)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        return first[0] if isinstance(first, tuple) else first
    return exc


def _dcp_load(state: dict[str, Any], path: Path, *, partial: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state, storage_reader=_SafeReader(path),
                 planner=_SafePlanner(allow_partial_load=partial))
    except (CheckpointException, Exception) as exc:  # DCP wraps each rank's failure
        cause = _root_cause(exc)
        if isinstance(cause, CheckpointError):  # ours, already naming the file
            raise type(cause)(str(cause)) from exc
        text = str(cause).strip()
        first = text.splitlines()[0][:160] if text else ""
        raise CheckpointError(f"cannot load the sharded checkpoint {str(path)!r}: "
                              f"{type(cause).__name__}: {first}") from exc


def _shard_problem(path: Path, metadata: Any) -> str | None:
    """A shard file that is missing or shorter than the metadata says, by name."""
    needed: dict[str, int] = {}
    for info in getattr(metadata, "storage_data", {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        shard = path / name
        if not shard.is_file():
            return f"sharded checkpoint {str(path)!r} is incomplete: its shard {name} is missing"
        actual = shard.stat().st_size
        if actual < size:
            return (f"sharded checkpoint {str(path)!r} is truncated: its shard {name} has "
                    f"{actual} bytes, its .metadata says at least {size}")
    return None


def dcp_problem(path: Path, *, need_extra: bool = True) -> str | None:
    """What keeps ``path`` from being a whole sharded checkpoint, or ``None``.

    Reads ``.metadata`` (small) and the shards' sizes, never the shards.
    ``need_extra=False`` accepts a DCP checkpoint without flexgraph's
    ``extra.pth`` (one written by another tool, fine for ``load_from``).
    """
    from flexgraph.training.checkpoint._files import file_problem

    shown = str(path)
    if not path.exists():
        return f"sharded checkpoint {shown!r} does not exist"
    if not path.is_dir():
        return (f"checkpoint {shown!r} is a file, but this strategy's checkpoints are sharded "
                f"(.dcp directories written by torch.distributed.checkpoint); use one of "
                f"those, or state_dict_cfg='full' for one-file checkpoints")
    if not (path / ".metadata").is_file():
        return (f"{shown!r} is not a sharded checkpoint: it has no .metadata (a directory "
                f"of another kind, or a save that was interrupted)")
    try:
        metadata = _SafeReader(path).read_metadata()
    except CheckpointError as exc:
        return str(exc)
    problem = _shard_problem(path, metadata)
    if problem is None and need_extra:
        extra = path / EXTRA_NAME
        if not extra.exists():
            return (f"sharded checkpoint {shown!r} has no {EXTRA_NAME} (flexgraph's loop "
                    f"state): written by another tool, or its save was interrupted; it can "
                    f"seed weights (load_from) but not resume")
        problem = file_problem(extra, verify=False)
    return problem


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
        from flexgraph.training.checkpoint._files import read_checkpoint_file

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
        return self.problem(path) is None

    def problem(self, path: Path) -> str | None:
        return dcp_problem(path)


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
        """Rank 0 reads the file; the other ranks get everything but the states.

        A file rank 0 cannot read raises the same error on every rank (the
        others would otherwise wait for rank 0's broadcast forever).
        """
        checkpoint, answer = None, None
        if rank_of() == 0:
            try:
                checkpoint = super().read(path)
                if not isinstance(checkpoint, dict):
                    raise CheckpointError(f"checkpoint {str(path)!r} holds a "
                                          f"{type(checkpoint).__name__}, not a checkpoint dict")
                answer = {k: v for k, v in checkpoint.items() if k not in SHARDED_KEYS}
            except CheckpointError as exc:
                answer = exc
        answer = _broadcast(answer)
        if isinstance(answer, CheckpointError):
            raise answer
        return checkpoint if checkpoint is not None else {**answer, "state_dict": {},
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
    problem = dcp_problem(path, need_extra=False)
    if problem is not None:
        raise CheckpointError(problem)
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
