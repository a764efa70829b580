"""Checkpoint formats, each recognised by what a path holds, never by its name.

No torch is imported, so ``flexgraph plan`` names a path's format without it.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

_KNOWN: list[CheckpointFormat] = []
#: The first bytes of torch's legacy (pre-1.6) save format: a pickled magic number.
LEGACY_TORCH_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)[:14]


@attrs.frozen
class CheckpointFormat:
    """One way a checkpoint is laid out on disk.

    Parameters
    ----------
    key
        Also the name of the format's opener entry point.
    name
        How messages name it.
    recognise
    """

    key: str
    name: str
    recognise: Callable[[Path], bool] = attrs.field(eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _KNOWN.append(self)


def _is_torch_save_file(path: Path) -> bool:
    """A zip archive with a ``data.pkl`` member, or torch's legacy (pre-1.6) pickle."""
    if not path.is_file():
        return False
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                return any(n == "data.pkl" or n.endswith("/data.pkl") for n in archive.namelist())
        except (zipfile.BadZipFile, OSError):
            return False
    with open(path, "rb") as f:
        return f.read(len(LEGACY_TORCH_MAGIC)) == LEGACY_TORCH_MAGIC


MANIFEST_NAME = "manifest.json"
"""A portable checkpoint's manifest, written last: without it the checkpoint does not count."""
PORTABLE_MARKER = ".flexgraph-portable"
"""Written first into a portable checkpoint, so an incomplete one is still known as one."""


def _is_portable_directory(path: Path) -> bool:
    return path.is_dir() and ((path / PORTABLE_MARKER).is_file()
                              or (path / MANIFEST_NAME).is_file())


def _is_dcp_directory(path: Path) -> bool:
    """``torch.distributed.checkpoint``'s ``.metadata``, written once every shard is."""
    return (path / ".metadata").is_file() and not _is_portable_directory(path)


def _is_deepspeed_directory(path: Path) -> bool:
    """A DeepSpeed checkpoint tag: ``save_checkpoint``'s ``*model_states.pt`` files."""
    return path.is_dir() and any(path.glob("*model_states.pt"))


def _is_safetensors_file(path: Path) -> bool:
    """safetensors' layout: an 8-byte little-endian header length, then a JSON object."""
    if not path.is_file():
        return False
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(9)
    return (len(head) == 9 and head[8:9] == b"{"
            and 0 < int.from_bytes(head[:8], "little") <= size - 8)


TORCH_SAVE_FILE = CheckpointFormat("torch", "a torch.save file (MMEngine's .pth)",
                                   _is_torch_save_file)
DCP_DIRECTORY = CheckpointFormat("dcp", "a torch.distributed.checkpoint directory (.metadata)",
                                 _is_dcp_directory)
SAFETENSORS_FILE = CheckpointFormat("safetensors", "a safetensors file", _is_safetensors_file)
DEEPSPEED_DIRECTORY = CheckpointFormat(
    "deepspeed", "a DeepSpeed checkpoint directory (*model_states.pt)", _is_deepspeed_directory)
PORTABLE_DIRECTORY = CheckpointFormat(
    "portable", "a portable checkpoint directory (torch.distributed.checkpoint + manifest.json)",
    _is_portable_directory)


def known_formats() -> tuple[CheckpointFormat, ...]:
    """Every format declared so far (flexgraph's, and those of imported strategies), in order.

    Returns
    -------
    tuple of CheckpointFormat
    """
    return tuple(_KNOWN)


def format_of(path: Path, formats: Iterable[CheckpointFormat] | None = None
              ) -> CheckpointFormat | None:
    """The first of ``formats`` (default: every known one) that ``path`` holds.

    Parameters
    ----------
    path : Path
    formats : iterable of CheckpointFormat, optional

    Returns
    -------
    CheckpointFormat or None
    """
    return next((f for f in (known_formats() if formats is None else formats)
                 if f.recognise(path)), None)


def unrecognised(path: Path, tried: Iterable[CheckpointFormat], *, what: str) -> str:
    """One line naming ``path``, the formats tried, and what it is when another format knows it.

    Parameters
    ----------
    path : Path
    tried : iterable of CheckpointFormat
    what : str
        What was expected (``'load_from'``).

    Returns
    -------
    str
    """
    tried = tuple(tried)
    names = " or ".join(f.name for f in tried)
    other = format_of(path, [f for f in known_formats() if f not in tried])
    if other is not None:
        return f"{what} {str(path)!r} is {other.name}; this strategy reads {names}"
    return (f"{what} {str(path)!r} is not a checkpoint: it is not {names}"
            + ("" if path.exists() else " (it does not exist)"))
