"""safetensors files: read with the safetensors library, written one tensor at a time.

A safetensors file holds named tensors and nothing else (no optimizer, no loop
state), and reading it runs no code at all, so it is the format models are
shared in. :func:`open_safetensors_file` reads it through
``safetensors.safe_open`` (memory-mapped: a tensor is read when it is fetched).

:func:`write_safetensors` writes the format itself, because the library's
writer takes every tensor at once: the layout is an 8-byte little-endian
header length, a JSON header giving each tensor's dtype, shape and byte range,
then the tensors' bytes in that order. The header is known before any tensor
is read, so each tensor is fetched, written and dropped in turn.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from flexgraph.training.checkpoint._source import CheckpointSource, weights_layout
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import SAFETENSORS_FILE

__all__ = ["TORCH_DTYPES", "open_safetensors_file", "safetensors_header", "write_safetensors"]

#: safetensors' dtype names (the library's own table).
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
           torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
           torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}
"""safetensors' dtype names -> torch dtypes."""


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (every tensor's dtype, shape, byte range)."""
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"safetensors file {str(path)!r} has no readable header "
                              f"({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"safetensors file {str(path)!r}: its header is not a JSON object")
    return header


def open_safetensors_file(path: Path) -> CheckpointSource:
    """A safetensors file as ``{'state_dict': weights}``, each tensor read when fetched."""
    from safetensors import safe_open

    header = safetensors_header(path)
    weights: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        code = entry.get("dtype") if isinstance(entry, Mapping) else entry
        dtype = TORCH_DTYPES.get(code) if isinstance(code, str) else None
        if dtype is None:
            raise CheckpointError(f"safetensors file {str(path)!r}: tensor {name!r} has "
                                  f"dtype {code!r}, which flexgraph does not read")
        weights[name] = torch.empty(entry["shape"], dtype=dtype, device="meta")
    layout = weights_layout(weights)
    stored = {k.removeprefix("module."): k for k in weights}
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # the library's own SafetensorError for a damaged file
        raise CheckpointError(f"safetensors file {str(path)!r} cannot be read: "
                              f"{str(exc).strip()[:160]}") from None

    def fetch(key: tuple[Any, ...]) -> torch.Tensor:
        return handle.get_tensor(stored[key[-1]])

    return CheckpointSource(path, SAFETENSORS_FILE.name, layout, fetch)


def write_safetensors(path: Path, weights: Mapping[str, torch.Tensor],
                      fetch: Callable[[str], torch.Tensor], *,
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write a safetensors file of ``weights``, fetching each tensor only to write it.

    Parameters
    ----------
    path:
        Where to write (the caller renames it into place).
    weights:
        Name -> a tensor of the right shape and dtype (a meta tensor will do).
    fetch:
        Name -> the tensor's values on the CPU.
    metadata:
        The header's ``__metadata__`` (strings only); ``{'format': 'pt'}`` by default.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, tensor in weights.items():
        if tensor.dtype not in _DTYPES:
            raise CheckpointError(f"tensor {name!r} is {tensor.dtype}, which safetensors "
                                  f"cannot hold")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the library aligns the data to 8 bytes
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for name, tensor in weights.items():
            _write_bytes(f, fetch(name), tensor)
        f.flush()
        os.fsync(f.fileno())


def _write_bytes(f: BinaryIO, value: torch.Tensor, expected: torch.Tensor) -> None:
    if tuple(value.shape) != tuple(expected.shape) or value.dtype != expected.dtype:
        raise CheckpointError(f"a tensor read as {tuple(value.shape)} {value.dtype}, its "
                              f"header says {tuple(expected.shape)} {expected.dtype}")
    flat = value.detach().contiguous().reshape(-1)
    if flat.numel():
        f.write(memoryview(flat.view(torch.uint8).numpy()))
