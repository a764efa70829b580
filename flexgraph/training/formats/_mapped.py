"""A checkpoint file opened for reading rows: each rank reads only its own slices.

Only the zip directory is checked: verifying every CRC would read the whole file
on every rank.
"""

from __future__ import annotations

import mmap
import warnings
import zipfile
from pathlib import Path
from typing import Any

import attrs
import torch

from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats._mmengine_types import allow_mmengine_types
from flexgraph.training.formats._recognise import (
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
)
from flexgraph.training.formats._safetensors import safetensors_entries
from flexgraph.training.formats._source import tensor_paths
from flexgraph.training.formats._torch_file import file_problem, read_checkpoint_file


@attrs.frozen
class _Place:
    """Where a tensor's element 0 is in the file, and how its elements are laid out."""

    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def by_rows(self) -> bool:
        expected, step = [], 1
        for size in reversed(self.shape):
            expected.append(step)
            step *= size
        return tuple(reversed(expected)) == self.stride or 0 in self.shape


@attrs.define(eq=False)
class MappedCheckpoint:
    """A checkpoint whose tensors stay in the file until touched.

    Parameters
    ----------
    path
    checkpoint
        What it holds (what ``load_from`` hooks see), its tensors mapped from the file.
    places : dict, optional
        Where each of the file's own tensors lies in it, by ``id``.
    own : dict, optional
        The file's own tensors by ``id`` (a hook's replacement is not one).
    """

    path: Path
    checkpoint: Any
    _places: dict[int, _Place] = attrs.field(factory=dict, repr=False)
    _own: dict[int, torch.Tensor] = attrs.field(factory=dict, repr=False)

    def _place_of(self, tensor: torch.Tensor) -> _Place | None:
        own = self._own.get(id(tensor))
        return self._places.get(id(tensor)) if own is tensor else None

    def read_rows(self, tensor: torch.Tensor, start: int, stop: int,
                  out: torch.Tensor) -> None:
        """Copy rows ``[start, stop)`` of ``tensor`` into ``out``: from the file where it is
        one of the file's own, else sliced in memory (a 0-d tensor is one row)."""
        place = self._place_of(tensor)
        if place is None or not place.by_rows or tensor.dim() == 0:
            with torch.no_grad():
                out.copy_(tensor if tensor.dim() == 0 else tensor[start:stop])
            return
        row = tensor[0].numel() * tensor.element_size() if tensor.shape[0] else 0
        direct = out.dtype == place.dtype and out.device.type == "cpu" and out.is_contiguous()
        buffer = out if direct else torch.empty(out.shape, dtype=place.dtype)
        _read_into(self.path, place.offset + start * row, buffer)
        if not direct:
            with torch.no_grad():
                out.copy_(buffer)


def _read_into(path: Path, offset: int, out: torch.Tensor) -> None:
    """Fill the contiguous CPU tensor ``out`` with the file's bytes from ``offset``."""
    view = memoryview(out.reshape(-1).view(torch.uint8).numpy()) if out.numel() else None
    if view is None:
        return
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        done = 0
        while done < len(view):
            got = f.readinto(view[done:])
            if not got:
                raise CheckpointError(f"checkpoint {str(path)!r} is truncated: a tensor's "
                                      f"bytes end before its index says")
            done += got


def meta_loaded(path: Path) -> Any:
    """The ``torch.save`` zip loaded onto the meta device: each storage knows its offset."""
    with warnings.catch_warnings(), allow_mmengine_types():
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        return torch.load(path, map_location="meta", weights_only=True)


def _map_torch_file(path: Path) -> MappedCheckpoint:
    problem = file_problem(path, verify=False)
    if problem is not None:
        raise CheckpointError(problem)
    mapped = read_checkpoint_file(path, mmap=True, verify=False)
    located = meta_loaded(path)
    result = MappedCheckpoint(path, mapped)
    pairs = zip(tensor_paths(mapped), tensor_paths(located), strict=False)
    for (where, tensor), (where_meta, meta) in pairs:
        offset = getattr(meta.untyped_storage(), "_checkpoint_offset", None)
        if where != where_meta or offset is None:
            continue
        result._own[id(tensor)] = tensor
        result._places[id(tensor)] = _Place(
            offset=int(offset) + meta.storage_offset() * meta.element_size(),
            shape=tuple(meta.shape), stride=tuple(meta.stride()), dtype=meta.dtype)
    return result


def _map_safetensors_file(path: Path) -> MappedCheckpoint:
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        # a private (copy-on-write) map: tensors over it are writable, the file never is
        region = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    weights: dict[str, torch.Tensor] = {}
    result = MappedCheckpoint(path, {"state_dict": weights})
    for name, entry, dtype in safetensors_entries(path):
        begin, end = (int(x) for x in entry["data_offsets"])
        shape = tuple(int(n) for n in entry["shape"])
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        tensor = (torch.frombuffer(region, dtype=dtype, count=count, offset=start + begin)
                  .view(shape) if count else torch.empty(shape, dtype=dtype))
        key = name.removeprefix("module.")
        weights[key] = tensor
        result._own[id(tensor)] = tensor
        result._places[id(tensor)] = _Place(offset=start + begin, shape=shape,
                                            stride=tuple(tensor.stride()), dtype=dtype)
    return result


def map_checkpoint(path: str | Path, held: CheckpointFormat | None) -> MappedCheckpoint | None:
    """The checkpoint at ``path`` opened for reading rows, or ``None`` for another format.

    Parameters
    ----------
    path
    held

    Returns
    -------
    MappedCheckpoint or None
    """
    path = Path(path)
    if held is TORCH_SAVE_FILE and zipfile.is_zipfile(path):  # not the legacy format
        return _map_torch_file(path)
    if held is SAFETENSORS_FILE:
        return _map_safetensors_file(path)
    return None

