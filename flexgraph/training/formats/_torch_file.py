"""Reading a checkpoint file safely, and what is wrong with one, in a line naming it.

``torch.load`` never checks the CRC-32 ``torch.save`` stores per zip member, so
changed tensor bytes would load as wrong weights; here a file is checked first.
"""

from __future__ import annotations

import mmap
import pickle
import struct
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
)
from flexgraph.training.formats._mmengine_types import allow_mmengine_types
from flexgraph.training.formats._recognise import LEGACY_TORCH_MAGIC

_ZIP_MAGIC = b"PK\x03\x04"
_CONVERT = "python -m torch.distributed.checkpoint.format_utils dcp_to_torch"
_PLAIN_PICKLE = "a plain Python pickle (pickle.dump), not a torch.save file"
_RESAVE = ("If you trust the file, re-save just its tensors (e.g. "
           "torch.save(obj.state_dict(), ...)) and load that.")


def _named(path: Path) -> str:
    return f"checkpoint {str(path)!r}"


def directory_problem(path: Path) -> str:
    """Why the directory ``path`` is not a checkpoint file.

    Parameters
    ----------
    path : Path

    Returns
    -------
    str
    """
    if (path / ".metadata").is_file():
        return (f"{_named(path)} is a sharded checkpoint directory (torch.distributed."
                f"checkpoint), which only FSDP's sharded IO restores (every IO loads its "
                f"weights with load_from); to resume from it here, convert it to one file: "
                f"{_CONVERT} {path} {path}.pth")
    if not any(path.iterdir()):
        return f"{_named(path)} is an empty directory, not a checkpoint"
    return (f"{_named(path)} is a directory, not a checkpoint file (it has no .metadata, "
            f"so it is no sharded checkpoint either)")


def _zip_problem(path: Path, size: int, verify: bool) -> str | None:
    if not zipfile.is_zipfile(path):
        return (f"{_named(path)} is truncated: it starts as a zip archive (torch.save's "
                f"format) but its {size} bytes end before the archive's directory; its "
                f"save or copy was cut short")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if not any(m.filename.endswith("data.pkl") for m in members):
                shown = ", ".join(repr(m.filename) for m in members[:3]) or "nothing"
                return (f"{_named(path)} is a zip archive but not a torch.save file: it has "
                        f"no data.pkl (it holds {shown})")
            if verify and any(m.CRC for m in members if m.file_size):
                bad = _first_bad_member(path, archive, members)
                if bad is not None:
                    return (f"{_named(path)} is corrupt: its member {bad!r} fails the CRC-32 "
                            f"check (its bytes changed after the save)")
    except Exception as exc:  # BadZipFile, "compression method not supported", ...
        return f"{_named(path)} is corrupt: its zip archive cannot be read ({_first_line(exc)})"
    return None


def _first_bad_member(path: Path, archive: zipfile.ZipFile,
                      members: list[zipfile.ZipInfo]) -> str | None:
    """The first member whose bytes fail their CRC-32, or ``None``; ``torch.save``'s are
    stored uncompressed, so each is checked over a map and stays cached for ``torch.load``."""
    if any(m.compress_type != zipfile.ZIP_STORED for m in members):
        return archive.testzip()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return next((m.filename for m in members if not _member_intact(mapped, m)), None)


def _member_intact(mapped: mmap.mmap, member: zipfile.ZipInfo) -> bool:
    """Whether ``member``'s header is where the directory says and its bytes match its CRC-32."""
    header = member.header_offset
    if mapped[header:header + 4] != _ZIP_MAGIC:
        return False
    name, extra = struct.unpack("<HH", mapped[header + 26:header + 30])
    start = header + 30 + name + extra
    with memoryview(mapped) as view, view[start:start + member.compress_size] as data:
        return len(data) == member.compress_size and zlib.crc32(data) == member.CRC


def file_problem(path: Path, *, verify: bool = True) -> str | None:
    """What is wrong with the would-be checkpoint file ``path``, or ``None``.

    Parameters
    ----------
    path : Path
    verify : bool, default True
        Check every member's CRC-32; ``False``: the structure only.

    Returns
    -------
    str or None
    """
    if not path.exists():
        return f"{_named(path)} does not exist"
    if path.is_dir():
        return directory_problem(path)
    size = path.stat().st_size
    if size == 0:
        return f"{_named(path)} is empty (0 bytes); its save or copy never wrote anything"
    return _zip_problem(path, size, verify) if _is_zip(path) else None


def _foreign_format(path: Path) -> str | None:
    """What ``path`` looks like, when it is recognisably not a torch.save file."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy file"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file (h5py, Keras)"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip-compressed file"
    if head.startswith(b"GGUF"):
        return "a GGUF model file"
    if len(head) > 9 and head[8:10] in (b'{"', b"{'") and int.from_bytes(head[:8], "little") \
            < path.stat().st_size:
        return "a safetensors file (weights only: load_from reads it)"
    if head[:1] == b"\x80" and not head.startswith(LEGACY_TORCH_MAGIC):
        return _PLAIN_PICKLE
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text and all(c.isprintable() or c.isspace() for c in text):
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"a text file (it starts with {first!r})"
    return None


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == _ZIP_MAGIC


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    line = line if len(line) <= 160 else line[:157] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _refusal(exc: pickle.UnpicklingError, path: Path) -> str | None:
    """What weights_only refused, or ``None`` when the pickle is merely broken (in a
    CRC-checked zip a failure is a refusal; elsewhere only a named global tells one)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = next((line for line in lines if "GLOBAL" in line or "global" in line), None)
    if named is not None:
        return named
    if _is_zip(path):
        return next((line for line in lines if "Unsupported" in line
                     or "is not one of" in line), lines[-1] if lines else "")
    return None


def read_checkpoint_file(path: str | Path, *, mmap: bool = False, verify: bool = True) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU, after checking the file.

    Parameters
    ----------
    path
    mmap
        Map the tensors' bytes instead of reading them (zip files).
    verify
        Check every member's CRC-32 first.

    Returns
    -------
    Any

    Raises
    ------
    UnsafeCheckpointError
        The file holds types beyond tensors, containers and MMEngine's few.
    CheckpointError
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"{_named(path)} does not exist")
    problem = file_problem(path, verify=verify)
    if problem is not None:
        raise CheckpointError(problem)
    try:
        with warnings.catch_warnings():  # a plain pickle's protocol warning precedes our error
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            with allow_mmengine_types():
                return torch.load(path, map_location="cpu", weights_only=True,
                                  mmap=mmap and _is_zip(path))
    except pickle.UnpicklingError as exc:
        detail = _refusal(exc, path)
        if detail is not None:
            raise UnsafeCheckpointError(
                f"refused to load {str(path)!r}: it contains objects other than tensors "
                f"and plain containers, and flexgraph only loads checkpoints with "
                f"torch.load(weights_only=True). {detail} {_RESAVE}") from None
        error: Exception = exc
    except Exception as exc:  # the unpickler and the zip reader fail in many ways
        error = exc
    foreign = _foreign_format(path)
    if foreign == _PLAIN_PICKLE:  # unpickling it is what weights_only exists to avoid
        raise UnsafeCheckpointError(
            f"refused to load {str(path)!r}: it is {foreign}, and flexgraph only loads "
            f"checkpoints with torch.load(weights_only=True). {_RESAVE}") from None
    if foreign is not None:
        raise CheckpointError(f"{_named(path)} is not a torch checkpoint: it looks like "
                              f"{foreign}") from error
    raise CheckpointError(f"{_named(path)} is corrupt: torch.load fails with "
                          f"{_first_line(error)}") from error
