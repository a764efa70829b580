"""A checkpoint's weights from its own index: names, shapes and dtypes, no tensor read."""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch

from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats._dcp_storage import SafeDCPStorage
from flexgraph.training.formats._mapped import meta_loaded
from flexgraph.training.formats._recognise import (
    DCP_DIRECTORY,
    PORTABLE_DIRECTORY,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    format_of,
)
from flexgraph.training.formats._safetensors import safetensors_entries
from flexgraph.training.formats._source import _flexgraph_layout
from flexgraph.training.formats._torch_file import file_problem

Shape = tuple[int, ...]


@attrs.frozen
class WeightsIndex:
    """The weights a checkpoint holds: name (as ``load_from`` reads it) -> (shape, dtype)."""

    path: Path
    format_name: str
    weights: Mapping[str, tuple[Shape, torch.dtype]]


def _torch_file_weights(path: Path) -> dict[str, tuple[Shape, torch.dtype]] | None:
    """The weights of a ``torch.save`` zip, every tensor on ``meta``."""
    if not zipfile.is_zipfile(path):
        return None  # torch's legacy format: its storages are read with its pickle
    problem = file_problem(path, verify=False)
    if problem is not None:
        raise CheckpointError(problem)
    try:
        checkpoint = meta_loaded(path)
    except Exception as exc:  # the unpickler refuses, or the pickle is broken
        raise CheckpointError(f"checkpoint {str(path)!r}: its index (data.pkl) cannot be "
                              f"read: {type(exc).__name__}: {str(exc).strip()[:160]}") from exc
    weights = _flexgraph_layout(checkpoint, path).get("state_dict")
    if not isinstance(weights, Mapping):
        return {}
    return {k: (tuple(v.shape), v.dtype) for k, v in weights.items()
            if isinstance(v, torch.Tensor)}


def _safetensors_weights(path: Path) -> dict[str, tuple[Shape, torch.dtype]]:
    out = {}
    for name, entry, dtype in safetensors_entries(path):
        out[name.removeprefix("module.")] = (tuple(entry["shape"]), dtype)
    return out


def _dcp_weights(path: Path, under: str | None) -> dict[str, tuple[Shape, torch.dtype]]:
    """A DCP ``.metadata``'s tensors under ``under`` (``None``: ``state_dict.`` if any)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    items = SafeDCPStorage(path).read_metadata().state_dict_metadata
    if under is None:
        under = "state_dict." if any(k.startswith("state_dict.") for k in items) else ""
    return {key.removeprefix(under).removeprefix("module."):
            (tuple(meta.size), meta.properties.dtype)
            for key, meta in items.items()
            if key.startswith(under) and isinstance(meta, TensorStorageMetadata)}


def weights_index(path: str | Path) -> WeightsIndex | None:
    """The weights ``path`` holds, read from its index alone.

    Parameters
    ----------
    path

    Returns
    -------
    WeightsIndex or None
        ``None`` where the index needs the tensors, or the format is unknown.
    """
    path = Path(path)
    found = format_of(path)
    if found is TORCH_SAVE_FILE:
        weights = _torch_file_weights(path)
    elif found is SAFETENSORS_FILE:
        weights = _safetensors_weights(path)
    elif found is DCP_DIRECTORY:
        weights = _dcp_weights(path, None)
    elif found is PORTABLE_DIRECTORY:
        weights = _dcp_weights(path, "model.")
    else:
        return None
    if weights is None:
        return None
    return WeightsIndex(path, found.name, weights)

