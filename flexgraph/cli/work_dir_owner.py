"""Which process of a launch owns the work_dir, and how the others recognise their own run.

The process that stands for the whole run takes the lock (node 0's launcher,
else global rank 0); the others only check that no other run owns it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any


def run_id(rendezvous: str | None = None, *, handed_down: str | None = None) -> str:
    """The id every process of this launch computes alike."""
    if handed_down:
        return handed_down
    if "SLURM_JOB_ID" in os.environ:
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', 'batch')}"
    if rendezvous:
        return f"rendezvous-{rendezvous}"
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return f"torchelastic-{os.environ['TORCHELASTIC_RUN_ID']}"
    return f"{socket.gethostname()}-{os.getpid()}"


@contextlib.contextmanager
def own_work_dir(settings: Any, *, owner: bool, this_run: str,
                 launcher: bool = False) -> Iterator[Any]:
    """Hold the work_dir for the block (``owner``), or check it is free; no launcher heartbeat."""
    from flexgraph.cli.watch_folder import remove_other_runs
    from flexgraph.training.output import check_work_dir_owner, take_work_dir

    if settings is None:
        yield None
        return
    if not owner:
        check_work_dir_owner(settings.work_dir, this_run)
        yield None
        return
    lock = take_work_dir(settings.work_dir, this_run,
                         **({"heartbeat_every": None} if launcher else {}))
    try:
        if lock.owned:  # a launcher's ranks start later: it clears its own run's too
            remove_other_runs(settings.work_dir, None if launcher else this_run)
        yield lock
    finally:
        lock.release()
