"""A run stopped by a signal: its exit status, and how the launcher passes it on.

A cleanly stopped process exits :data:`EXIT_STOPPED` (75, ``EX_TEMPFAIL``).
torch's elastic agent keeps no exit status for ranks it stopped, so each rank
leaves :data:`STOP_NOTE` in the launcher's progress folder once saved.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flexgraph.training.errors import TrainingStopped
from flexgraph.training.output import PROGRESS_DIR_VAR

EXIT_STOPPED = 75
STOP_NOTE = "stopped"
"""The file each rank writes in the launcher's progress folder once a stop's checkpoint is saved."""
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""Signals the launcher forwards to the ranks (torch's four, plus SLURM's usual two)."""
_IGNORED_ON_EXIT = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


def report_stop(stop: TrainingStopped) -> int:
    """Say that the run stopped; return :data:`EXIT_STOPPED`.

    A launcher's rank leaves its note for the launcher; any other process says it on rank 0.
    """
    ignore_stop_signals(stop.signal_name)
    folder = os.environ.get(PROGRESS_DIR_VAR)
    if folder:
        _leave_note(Path(folder), str(stop), stop.rank)
    elif stop.rank == 0:
        say_stopped(str(stop))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        end_launched_rank(EXIT_STOPPED)
    return EXIT_STOPPED


def ignore_stop_signals(signal_name: str) -> None:
    """Ignore the stop signals and ``signal_name`` until exit, so none turns 75 into a death."""
    for name in dict.fromkeys([*_IGNORED_ON_EXIT, signal_name]):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(signal.Signals[name], signal.SIG_IGN)


def end_launched_rank(status: int) -> None:
    """End a launched rank now, with ``status``, skipping the interpreter's teardown.

    The C++ teardown races the other ranks' exit, and c10d or gloo threads can
    abort it, which the agent would take for a crash (pytorch/pytorch#190489).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def launcher_signals(policy_signals: Iterable[str]) -> str:
    """``--signals-to-handle`` for torch's agent: :data:`FORWARDED` and the run's own."""
    return ",".join(dict.fromkeys([*FORWARDED, *policy_signals]))


def say_stopped(note: str) -> None:
    """The one line a stopped run prints: what stopped it where, and how to go on."""
    print(f"flexgraph: {note}; continue it with --resume auto (exit status {EXIT_STOPPED})",
          file=sys.stderr)


def _leave_note(folder: Path, note: str, rank: int) -> None:
    """Write ``note`` as :data:`STOP_NOTE` whole or not at all (ranks may write it at once)."""
    temp = folder / f".{STOP_NOTE}.{rank}"
    with contextlib.suppress(OSError):
        temp.write_text(note)
        os.replace(temp, folder / STOP_NOTE)


def stop_note(progress_dir: str | os.PathLike[str]) -> str:
    try:
        return (Path(progress_dir) / STOP_NOTE).read_text().strip()
    except OSError:
        return ""


def ranks_stopped(failures: Mapping[Any, Any]) -> bool:
    """A rank exited :data:`EXIT_STOPPED`, the others too or by the agent's SIGTERM.

    A rank exits 75 only after the save's last barrier, so one proves the checkpoint whole.
    """
    codes = [f.exitcode for f in failures.values()]
    return EXIT_STOPPED in codes and all(c in (EXIT_STOPPED, -signal.SIGTERM) for c in codes)
