"""Stopping a run cleanly on a signal: finish the iteration, save, end the run.

A signal may reach the ranks at different iterations, but the save is a
collective: every ``check_interval`` iterations the ranks all-reduce (MAX) the
signal each received. The handler never raises, so no signal cuts into a save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import torch

from flexgraph.training.config import StopPolicy


def _say(line: str) -> None:
    """Write one line to stderr from a signal handler (no Python stream locks involved)."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode())


class StopRequest:
    """The signal handlers of one training run, and the stop they request (agreed on
    ``device``, the process group's)."""

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
        """The signal to stop on after ``iters_done`` iterations, or 0 to go on."""
        if self.world_size == 1:
            return self.signum if self.pending else 0
        if not self.policy.signals or iters_done % self.policy.check_interval:
            return 0
        flag = torch.tensor([self.signum], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())
