"""Checkpoint formats: what a path holds, told by its content, and reading it safely.

Everything here reads; nothing saves a run or builds a model.

- *Recognising* (:class:`CheckpointFormat`, :func:`format_of`): a ``torch.save``
  file, a ``torch.distributed.checkpoint`` (DCP) directory, a safetensors file,
  a DeepSpeed tag, a portable checkpoint, each judged by a few bytes or a
  directory listing, never by a name. This needs no torch: ``flexgraph plan``
  says which format a ``load_from`` or ``resume`` path holds without importing
  it.
- *Reading safely*: a ``torch.save`` file is checked (its zip directory, every
  member's CRC-32) and loaded with ``weights_only=True``
  (:func:`read_checkpoint_file`), admitting besides tensors and plain
  containers only the types MMEngine's checkpoints hold
  (:func:`mmengine_globals`); a DCP directory's metadata goes through an
  unpickler that admits DCP's own classes alone (:func:`dcp_load`,
  :func:`dcp_problem`). A damaged file is one line naming it and what is wrong.
- *Headers and indexes*: what a checkpoint holds without reading its tensors
  (a safetensors header, :func:`safetensors_header`; DCP's ``.metadata``,
  through :class:`SafeDCPStorage`).
- *Opening* any format as a :class:`CheckpointSource`, one tensor at a time
  (:func:`open_checkpoint`), and reading one whole for ``load_from``
  (:func:`read_any_checkpoint`), through the *opener* of its format:
  flexgraph's own, and those strategies add through the
  ``flexgraph.checkpoint_openers`` entry-point group, each imported only when
  a path of its format is opened.

Importing this package imports no torch: the names that need it are loaded on
first use, so recognising a format stays torch-free.
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
    "SafeDCPStorage",
    "dcp_load",
    "dcp_problem",
    "directory_problem",
    "file_problem",
    "format_of",
    "known_formats",
    "mmengine_globals",
    "open_checkpoint",
    "read_any_checkpoint",
    "read_checkpoint_file",
    "replace_tensors",
    "safetensors_header",
    "single_process_dcp",
    "tensor_paths",
    "unrecognised",
    "unrecognised_by",
    "weights_layout",
]

_LAZY = {
    "_torch_file": ("directory_problem", "file_problem", "read_checkpoint_file"),
    "_mmengine_types": ("mmengine_globals",),
    "_dcp_storage": ("EXTRA_NAME", "SafeDCPStorage", "dcp_load", "dcp_problem"),
    "_safetensors": ("SAFETENSORS_DTYPES", "TORCH_DTYPES", "safetensors_header"),
    "_source": ("CheckpointSource", "KeyPath", "replace_tensors", "single_process_dcp",
                "tensor_paths", "weights_layout"),
    "_open": ("open_checkpoint", "read_any_checkpoint", "unrecognised_by"),
}
"""The modules behind the face that import torch, and the names each gives it."""
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import the torch-backed names on first use: recognising a format needs none of them."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
