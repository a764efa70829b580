"""A run stopped by a signal: its exit status, and how the launcher passes it on.

A training process that a stop signal ended cleanly (it saved a checkpoint at
an iteration boundary, see :mod:`flexgraph.training.loop._preemption`) exits with
:data:`EXIT_STOPPED`, 75: ``EX_TEMPFAIL`` of ``sysexits.h``, "a temporary
failure; the user is invited to retry later". A job script requeues on 75 and
runs the same command with ``--resume auto``.

The launcher (:mod:`flexgraph.cli.launch`) runs torch's elastic agent, which on
SIGTERM, SIGINT and the other signals it is told to handle (:func:`launcher_signals`)
forwards the signal to every rank's process group, waits for the ranks to exit
(``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` seconds, 30 by default, then SIGKILL) and
raises. The agent keeps no exit status for ranks it stopped, so each rank
leaves a note in the launcher's progress folder (:data:`STOP_NOTE`) once the
stop's checkpoint is saved; with the note the launcher says what stopped
where and exits 75, without it ``128 + signal`` as a process killed by that
signal would.

When the signal reached the ranks but not the launcher, the agent sees ranks
exit 75 and stops the others with SIGTERM as they exit too. A rank exits 75
only after the save's last barrier, so one such rank proves the checkpoint
whole (:func:`ranks_stopped`); the launcher then exits 75 without restarting
the group, whether the others exited 75 or were terminated on their way out.
That is why every rank writes the note, and why the launcher, not rank 0,
prints it: rank 0 may be the one terminated on its way out (its note and its
line were lost that way, once in a few dozen stops on a loaded machine).
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
"""The file each rank writes in the launcher's progress folder once a stop's checkpoint is
saved (the same text on every rank: the signal, the iteration and the checkpoint)."""
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""Signals the launcher forwards to the ranks (torch's four, plus SLURM's usual two)."""
_IGNORED_ON_EXIT = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


def report_stop(stop: TrainingStopped) -> int:
    """In a training process: say that the run stopped; return :data:`EXIT_STOPPED`.

    A rank of flexgraph's launcher leaves its note for the launcher, which
    says it once (see the module docstring); any other process says it itself
    on rank 0. From here to its exit the process ignores stop signals: its
    checkpoint is saved, and a forwarded or repeated signal must not turn
    status 75 into a death by signal. (Called by ``main``, whose process is
    about to exit.)
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
    """Ignore the stop signals (and ``signal_name``, the one that stopped the run) from now
    to the process's exit: its checkpoint is saved, and a forwarded or repeated signal, or
    the SIGTERM with which SLURM cancels a job it requeues, must not turn its exit status
    into a death by signal. (Main thread only; elsewhere a no-op.)"""
    for name in dict.fromkeys([*_IGNORED_ON_EXIT, signal_name]):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(signal.Signals[name], signal.SIG_IGN)


def end_launched_rank(status: int) -> None:
    """End a launched rank now, with ``status``, skipping the interpreter's teardown.

    Called once everything the run wrote is closed and on disk (checkpoints
    fsynced, the log and metrics closed as the loop and the run record ended)
    and the rank has left the process group. What is left is C++ teardown that
    races the other ranks' exit: a rank's c10d and gloo threads can abort it
    there (``terminate called without an active exception``, SIGABRT; about
    one stop in ten here when rank 0 hosts the rendezvous store, and one
    finished run in a few dozen on a loaded machine), and the agent would take
    a finished or stopped rank for a crashed one (pytorch/pytorch#190489).
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
    """The ranks' note that they stopped and saved (empty when none did)."""
    try:
        return (Path(progress_dir) / STOP_NOTE).read_text().strip()
    except OSError:
        return ""


def ranks_stopped(failures: Mapping[Any, Any]) -> bool:
    """A rank exited :data:`EXIT_STOPPED`, the others too or by the agent's SIGTERM."""
    codes = [f.exitcode for f in failures.values()]
    return EXIT_STOPPED in codes and all(c in (EXIT_STOPPED, -signal.SIGTERM) for c in codes)
