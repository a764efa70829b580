"""Reading ``torch.distributed.checkpoint`` (DCP) directories safely.

DCP's ``FileSystemReader`` unpickles ``.metadata`` and non-tensor items with
``weights_only=False``; here the metadata goes through an unpickler admitting
DCP's classes alone, and other items through ``weights_only=True``.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from flexgraph.training.errors import CheckpointError, UnsafeCheckpointError
from flexgraph.training.formats._torch_file import file_problem

EXTRA_NAME = "extra.pth"
"""flexgraph's file beside a DCP checkpoint's shards: loop state, schedulers, RNG states."""


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


class SafeDCPStorage(FileSystemReader):
    """DCP's file-system storage with the metadata read through :class:`_MetadataUnpickler`."""

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


def dcp_load(state: dict[str, Any], path: Path, *, partial: bool = False,
             alone: bool = False) -> None:
    """``torch.distributed.checkpoint.load`` of ``state`` from ``path``, read safely.

    A collective unless ``alone``; a failure on any rank is one error naming the directory.

    Parameters
    ----------
    state : dict
    path : Path
    partial : bool, default False
        Allow ``state`` to ask for only some of the keys.
    alone : bool, default False
        DCP's ``no_dist``.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # asked for: no news that it runs without the group
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=SafeDCPStorage(path),
                     planner=_SafePlanner(allow_partial_load=partial), no_dist=alone)
    except (CheckpointException, Exception) as exc:  # DCP wraps each rank's failure
        cause = _root_cause(exc)
        if isinstance(cause, CheckpointError):  # ours, already naming the file
            raise type(cause)(str(cause)) from exc
        text = str(cause).strip()
        first = text.splitlines()[0][:160] if text else ""
        raise CheckpointError(f"cannot load the sharded checkpoint {str(path)!r}: "
                              f"{type(cause).__name__}: {first}") from exc


def _shard_problem(path: Path, metadata: Any) -> str | None:
    """A shard file that is missing or shorter than the metadata says."""
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
    """What keeps ``path`` from being a whole sharded checkpoint, or ``None``; reads no shard.

    Parameters
    ----------
    path : Path
    need_extra : bool, default True
        Require flexgraph's ``extra.pth``; ``False`` accepts another tool's.

    Returns
    -------
    str or None
    """
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
        metadata = SafeDCPStorage(path).read_metadata()
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
