"""A save that fails because the device is full, said as such.

Neither ``torch.save``'s zip writer nor DCP says "no space left": ``ENOSPC`` is
only the ``__context__`` on the rank that wrote, and other ranks of a DCP save
get the text alone, so a short zip write counts as a full device when the
filesystem has less room than the state needs.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.errors import DeviceFullError

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
#: What torch's zip writer says when a write came up short, without saying why.
_SHORT_WRITE_TEXTS = ("unexpected pos", "file write failed")


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested container (a DTensor at its global size).

    Parameters
    ----------
    obj

    Returns
    -------
    int
    """
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def human_bytes(size: float) -> str:
    """A size in bytes as people read it, in B, KiB, MiB or GiB.

    Parameters
    ----------
    size : float

    Returns
    -------
    str
        E.g. ``'1.5 KiB'``.
    """
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _errors_in(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and each rank's failure inside a DCP exception."""
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # DCP's CheckpointException
        if isinstance(failures, dict):
            pending += [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _is_device_full(exc: BaseException, directory: Path, needed: int) -> bool:
    errors = list(_errors_in(exc))
    if any(isinstance(e, OSError) and e.errno in _FULL_ERRNOS for e in errors):
        return True
    texts = [str(e) for e in errors]
    if any(t in text for text in texts for t in _FULL_TEXTS):
        return True
    if any(t in text for text in texts for t in _SHORT_WRITE_TEXTS):
        free = _free_bytes(directory)
        return free is not None and free < max(needed, 1)
    return False


def device_full_error(exc: BaseException, path: Path, *, needed: int,
                      intact: Path | None) -> DeviceFullError | None:
    """A ``DeviceFullError`` for a save that failed with ``exc`` on a full device, else
    ``None``; call it before the partial checkpoint is removed (the room left is measured)."""
    directory = path.parent
    if not _is_device_full(exc, directory, needed):
        return None
    free = _free_bytes(directory)
    room = f" ({human_bytes(free)} free)" if free is not None else ""
    kept = (f"the previous checkpoint {str(intact)!r} is intact and resumes "
            f"(--resume auto)" if intact is not None else "no earlier checkpoint exists")
    return DeviceFullError(
        f"the device is full: saving checkpoint {str(path)!r} needs about "
        f"{human_bytes(needed)} (the state's size) and {str(directory)!r} has no room left"
        f"{room}; {kept}; free some space, lower max_keep_ckpts, or put work_dir on a "
        f"larger device")
