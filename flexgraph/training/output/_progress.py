"""How far a launched rank got, kept where its launcher can read it after the rank dies.

A launcher that sees a rank die (SIGKILL, the OOM killer, a segfault) learns the
exit status from the process and nothing else: a killed process writes no error
file. So a rank started by ``flexgraph run --nproc-per-node N`` keeps one short
record in a file its launcher names (``FLEXGRAPH_PROGRESS_DIR``/``rank<R>``, see
:mod:`flexgraph.training.output._launch_env`): the step it is running and,
during training, the iterations done at the last log line.

The record is rewritten only at events the run has anyway (the start of each
step; each log line, which the loop emits every ``log_interval`` iterations and
at epoch ends), never per iteration. That is its price: the iteration it gives
is a lower bound, up to one log interval behind the truth. Without the variable
(a single process, or ranks started by ``torchrun`` directly) nothing is written.

One record per process, opened once by the command that runs it
(:func:`open_progress`) and handed to its two writers as an argument, through
the run's context: the executor hook that reports the step, and the training
output that reports the iterations.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["Progress", "open_progress", "read_progress"]


class Progress:
    """The record of one rank: ``{"step": ..., "iter": ..., "every": ...}``, rewritten in place.

    Parameters
    ----------
    path : Path
        The rank's file in the launcher's progress folder (created, or emptied).
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

    def _write(self) -> None:
        data = json.dumps(self._record).encode()
        self._size = max(self._size, len(data))
        os.pwrite(self._fd, data.ljust(self._size), 0)


def open_progress(folder: str | os.PathLike[str] | None, rank: int) -> Progress | None:
    """The record of ``rank`` in its launcher's ``folder`` (``None`` without a folder).

    Parameters
    ----------
    folder : path, optional
        The launcher's progress folder (``FLEXGRAPH_PROGRESS_DIR``), if it named one.
    rank : int
        This process's global rank: the record is ``folder/rank<rank>``.

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
        The launcher's progress folder.
    rank : int
        The rank whose record to read.

    Returns
    -------
    dict
        ``{"step": ..., "iter": ..., "every": ...}``, or ``{}``.
    """
    try:
        return json.loads((Path(folder) / f"rank{rank}").read_text() or "{}")
    except (OSError, ValueError):
        return {}
