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
raises. The agent keeps no exit status for ranks it stopped, so rank 0 leaves
a note in the launcher's progress folder (:data:`STOP_NOTE`) once its
checkpoint is saved; with the note the launcher exits 75, without it
``128 + signal`` as a process killed by that signal would.

When the signal reached the ranks but not the launcher, the agent sees ranks
exit 75 and stops the others with SIGTERM as they exit too. A rank exits 75
only after the save's last barrier, so one such rank proves the checkpoint
whole (:func:`ranks_stopped`); the launcher then exits 75 without restarting
the group, whether the others exited 75 or were terminated on their way out.
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
"""The file rank 0 writes in the launcher's progress folder once a stop's checkpoint is saved."""
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
"""Signals the launcher forwards to the ranks (torch's four, plus SLURM's usual two)."""
_IGNORED_ON_EXIT = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


def report_stop(stop: TrainingStopped) -> int:
    """In a training process: say (rank 0) that the run stopped; return :data:`EXIT_STOPPED`.

    From here to its exit the process ignores stop signals: its checkpoint is
    saved, and a forwarded or repeated signal must not turn status 75 into a
    death by signal. (Called by ``main``, whose process is about to exit.)
    """
    for name in dict.fromkeys([*_IGNORED_ON_EXIT, stop.signal_name]):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(signal.Signals[name], signal.SIG_IGN)
    if stop.rank == 0:
        print(f"flexgraph: {stop}; continue it with --resume auto (exit status "
              f"{EXIT_STOPPED})", file=sys.stderr)
        folder = os.environ.get(PROGRESS_DIR_VAR)
        if folder:
            with contextlib.suppress(OSError):
                (Path(folder) / STOP_NOTE).write_text(str(stop))
    if "TORCHELASTIC_RUN_ID" in os.environ:
        end_launched_rank(EXIT_STOPPED)
    return EXIT_STOPPED


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


def stop_note(progress_dir: str | os.PathLike[str]) -> str:
    """Rank 0's note that it stopped and saved (empty when it did not)."""
    try:
        return (Path(progress_dir) / STOP_NOTE).read_text().strip()
    except OSError:
        return ""


def ranks_stopped(failures: Mapping[Any, Any]) -> bool:
    """A rank exited :data:`EXIT_STOPPED`, the others too or by the agent's SIGTERM."""
    codes = [f.exitcode for f in failures.values()]
    return EXIT_STOPPED in codes and all(c in (EXIT_STOPPED, -signal.SIGTERM) for c in codes)
