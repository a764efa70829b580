"""safetensors files (an 8-byte header length, a JSON header, the bytes): read without code."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats._recognise import SAFETENSORS_FILE
from flexgraph.training.formats._source import CheckpointSource, weights_layout

SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2"}
"""torch dtypes -> safetensors' dtype names (the library's own table)."""
TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file.

    Parameters
    ----------
    path : Path

    Returns
    -------
    dict
    """
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


def safetensors_entries(path: Path) -> Iterator[tuple[str, Mapping[str, Any], torch.dtype]]:
    """Each tensor's ``(name, header entry, torch dtype)``; an unknown dtype is refused."""
    for name, entry in safetensors_header(path).items():
        if name == "__metadata__" or not isinstance(entry, Mapping):
            continue
        dtype = TORCH_DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"safetensors file {str(path)!r}: tensor {name!r} has dtype "
                                  f"{entry.get('dtype')!r}, which flexgraph does not read")
        yield name, entry, dtype


def open_safetensors_file(path: Path) -> CheckpointSource:
    """A safetensors file as ``{'state_dict': weights}``, each tensor read when fetched."""
    from safetensors import safe_open

    weights = {name: torch.empty(entry["shape"], dtype=dtype, device="meta")
               for name, entry, dtype in safetensors_entries(path)}
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
