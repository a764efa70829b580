"""Checkpoint formats: what a path holds, told by its content, and reading it safely.

:func:`format_of` needs no torch; the names that need torch are loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from flexgraph.training.formats._recognise import (
    DCP_DIRECTORY,
    DEEPSPEED_DIRECTORY,
    MANIFEST_NAME,
    PORTABLE_DIRECTORY,
    PORTABLE_MARKER,
    SAFETENSORS_FILE,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    format_of,
    known_formats,
    unrecognised,
)

__all__ = [
    "DCP_DIRECTORY",
    "DEEPSPEED_DIRECTORY",
    "EXTRA_NAME",
    "MANIFEST_NAME",
    "PORTABLE_DIRECTORY",
    "PORTABLE_MARKER",
    "SAFETENSORS_DTYPES",
    "SAFETENSORS_FILE",
    "TORCH_DTYPES",
    "TORCH_SAVE_FILE",
    "CheckpointFormat",
    "CheckpointSource",
    "KeyPath",
    "MappedCheckpoint",
    "SafeDCPStorage",
    "dcp_load",
    "dcp_problem",
    "directory_problem",
    "file_problem",
    "format_of",
    "known_formats",
    "map_checkpoint",
    "open_checkpoint",
    "read_any_checkpoint",
    "read_checkpoint_file",
    "replace_tensors",
    "safetensors_header",
    "single_process_dcp",
    "tensor_paths",
    "unrecognised",
    "unrecognised_by",
    "weights_index",
    "weights_layout",
]

_LAZY = {
    "_torch_file": ("directory_problem", "file_problem", "read_checkpoint_file"),
    "_dcp_storage": ("EXTRA_NAME", "SafeDCPStorage", "dcp_load", "dcp_problem"),
    "_safetensors": ("SAFETENSORS_DTYPES", "TORCH_DTYPES", "safetensors_header"),
    "_source": ("CheckpointSource", "KeyPath", "replace_tensors", "single_process_dcp",
                "tensor_paths", "weights_layout"),
    "_open": ("open_checkpoint", "read_any_checkpoint", "unrecognised_by"),
    "_index": ("weights_index",),
    "_mapped": ("MappedCheckpoint", "map_checkpoint"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import the torch-backed names on first use: recognising a format needs none of them."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
