"""Stopping a run cleanly on a signal: finish the iteration, save, end the run.

Clusters preempt jobs with SIGTERM and follow with SIGKILL a grace period
later; SLURM sends a chosen signal ahead of the time limit
(``--signal=USR1@90``); a user presses Ctrl-C (SIGINT). On any of the
:class:`~flexgraph.training.config.StopPolicy`'s signals, a
:class:`StopRequest` lets the loop finish the iteration under way, save a
checkpoint at that iteration boundary and raise
:class:`~flexgraph.training.errors.TrainingStopped`; ``--resume auto`` then
continues exactly where it stopped.

How the ranks agree on where to stop. A signal may reach the ranks at
different iterations (or reach only some of them), but the save is a
collective, so all ranks must stop after the same iteration. Every
``check_interval`` iterations (an event precomputed like the loop's others)
each rank contributes the signal it received, or 0, to one all-reduce (MAX) of
a single number; a non-zero result stops every rank there. A single process
needs no agreement and stops after the iteration the signal arrived in.

Cost. Between checks the hot loop reads one attribute per iteration
(``pending``, which only a single process's handler sets). A check is one
all-reduce of one element, plus the wait for the slowest rank, which the next
gradient all-reduce would have waited for anyway.

Signals while stopping. The handler never raises, so no signal can cut into a
save: a second signal (a launcher forwarding the one a scheduler also sent to
every process delivers two) is reported and otherwise ignored. SIGKILL still
stops a process at once, and is safe too: saves are atomic, so the previous
complete checkpoint stays loadable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import torch

from flexgraph.training.config import StopPolicy

__all__ = ["StopRequest"]


def _say(line: str) -> None:
    """Write one line to stderr from a signal handler (no Python stream locks involved)."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


class StopRequest:
    """The signal handlers of one training run, and the stop they request.

    The ranks agree on a stop through a one-element tensor on ``device`` (the
    process group's: CUDA for NCCL).
    """

    def __init__(self, policy: StopPolicy | None = None, *, world_size: int = 1, rank: int = 0,
                 device: str = "cpu") -> None:
        self.policy = policy or StopPolicy()
        self.world_size = world_size
        self.rank = rank
        self.device = device
        self.signum = 0
        """The first stop signal this process received (0: none)."""
        self.pending = False
        """Set by the handler of a single process: stop after the current iteration."""
        self._previous: dict[int, Any] = {}

    # -- handlers --------------------------------------------------------------------
    def install(self) -> None:
        """Handle the policy's signals from now on (main thread only; else a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there; the run keeps the defaults
        for name in self.policy.signals:
            signum = signal.Signals[name]
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            if self.rank == 0:
                _say(f"flexgraph: {name} again: already stopping; the checkpoint save is not "
                     f"interrupted (SIGKILL stops at once and keeps the previous checkpoint)")
            return
        self.signum = signum
        if self.world_size == 1:
            self.pending = True
            when = "after this iteration"
        else:
            when = (f"at the ranks' next agreement (every {self.policy.check_interval} "
                    f"iterations)")
        if self.rank == 0:
            _say(f"flexgraph: {name}: stopping {when}, saving a checkpoint, then exiting")

    # -- agreement -------------------------------------------------------------------
    def next_check(self, iters_done: int) -> int | None:
        """The iteration count of the next agreement after ``iters_done`` (``None``: alone)."""
        if self.world_size == 1 or not self.policy.signals:
            return None
        interval = self.policy.check_interval
        return (iters_done // interval + 1) * interval

    def due(self, iters_done: int) -> int:
        """The signal to stop on after ``iters_done`` iterations, or 0 to go on.

        With several ranks, a collective at every ``check_interval``-th iteration
        (every rank reaches it, since the loop schedules it as an event) and 0
        without communicating elsewhere.
        """
        if self.world_size == 1:
            return self.signum if self.pending else 0
        if not self.policy.signals or iters_done % self.policy.check_interval:
            return 0
        flag = torch.tensor([self.signum], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())
