"""How far a launched rank got, kept where its launcher can read it after the rank dies.

Rewritten at the start of each step and at each log line, never per iteration,
so the iteration it gives may lag by up to one log interval.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Progress:
    """The record of one rank: ``{"step": ..., "iter": ..., "every": ...}`` (and ``"done"``
    once its run finished), rewritten in place.

    Parameters
    ----------
    path : Path
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._record: dict[str, Any] = {"step": None, "iter": None, "every": None}
        self._size = 0  # a record is padded to the longest so far: no stale tail

    def step(self, name: str) -> None:
        """The rank starts step ``name``."""
        self._record.update(step=name, iter=None)
        self._write()

    def iteration(self, iters_done: int, every: int) -> None:
        """``iters_done`` iterations are done; the next record comes at most ``every`` later."""
        self._record.update(iter=iters_done, every=every)
        self._write()

    def finished(self) -> None:
        """The rank's run is done: one that exits 0 without this its launcher reports as failed."""
        self._record["done"] = True
        self._write()

    def _write(self) -> None:
        data = json.dumps(self._record).encode()
        self._size = max(self._size, len(data))
        os.pwrite(self._fd, data.ljust(self._size), 0)


def open_progress(folder: str | os.PathLike[str] | None, rank: int) -> Progress | None:
    """The record of ``rank`` in its launcher's ``folder`` (``None`` without a folder).

    Parameters
    ----------
    folder : path, optional
    rank : int

    Returns
    -------
    Progress or None
    """
    return Progress(Path(folder) / f"rank{rank}") if folder else None


def read_progress(folder: str | os.PathLike[str], rank: int) -> dict[str, Any]:
    """The last record of ``rank`` in ``folder`` (empty if it wrote none).

    Parameters
    ----------
    folder : str or PathLike
    rank : int

    Returns
    -------
    dict
    """
    try:
        return json.loads((Path(folder) / f"rank{rank}").read_text() or "{}")
    except (OSError, ValueError):
        return {}
