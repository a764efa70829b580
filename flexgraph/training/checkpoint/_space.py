"""A save that fails because the device is full, said as such.

On a full device ``torch.save`` fails with ``RuntimeError: [enforce fail at
inline_container.cc:672] . unexpected pos 45568 vs 45460`` (its zip writer
notices the short write only when it closes the archive), and DCP wraps each
rank's failure in a ``CheckpointException`` (a ``BaseException``). Neither says
"no space left". The OS did say it, though: the ``OSError`` with ``ENOSPC`` is
the torch error's ``__context__`` on the rank that wrote. On the other ranks of
a DCP save only the failure's text arrived (exceptions are pickled without their
context), so there a zip-writer failure counts as a full device when the
filesystem has less room left than the state needs.

:func:`device_full_error` turns either into a :class:`DeviceFullError` that
names the checkpoint being written, the size it needs, the room left and the
checkpoint that is still intact; the :class:`Checkpointer` calls it at the one
place every save passes through.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.errors import DeviceFullError

__all__ = ["device_full_error", "human_bytes", "tensor_bytes"]

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
#: What torch's zip writer says when a write came up short, without saying why.
_SHORT_WRITE_TEXTS = ("unexpected pos", "file write failed")


def tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested dict / list / tuple (a DTensor at its global size).

    Parameters
    ----------
    obj
        A checkpoint, or any part of one.

    Returns
    -------
    int
        What the tensors take in memory: roughly what a save writes.
    """
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def human_bytes(size: float) -> str:
    """``1536`` -> ``'1.5 KiB'``: a size as people read it.

    Parameters
    ----------
    size : float
        A size in bytes.

    Returns
    -------
    str
        The size in B, KiB, MiB or GiB.
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
    """A :class:`DeviceFullError` for a save that failed with ``exc``, if the device was full.

    Call it before the partly written checkpoint is removed: the room left is
    measured then.

    Parameters
    ----------
    exc
        What the write raised (on this rank).
    path
        The checkpoint's final name (what the user will look for).
    needed
        About what the state takes (:func:`tensor_bytes`).
    intact
        The newest complete checkpoint, which the failed save left untouched.

    Returns
    -------
    DeviceFullError or None
        ``None`` when ``exc`` is not a full device: the caller re-raises it.
    """
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
