"""Which process of a launch owns the work_dir, and how the others recognise their own run.

The lock itself is :mod:`flexgraph.training.output._lock`. The launch decides
who takes it: the process that stands for the whole run, which is the
launcher of node 0 when flexgraph launches the ranks (it outlives them and
their restarts), else global rank 0. Every other process only checks that no
other run owns the work_dir, so that all of a refused run's processes stop,
not rank 0 alone while the others wait for it.

Every process of one launch shares a run id (:func:`run_id`): the launcher
hands its own to its ranks (:data:`~flexgraph.training.output.RUN_ID_VAR`);
ranks started by ``srun`` share the SLURM job and step; ranks started by
``torchrun`` share its run id. A rank 0 whose launcher holds the lock finds its
own run id in it, goes on, and keeps the lock's heartbeat for the launcher.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any


def run_id(rendezvous: str | None = None, *, handed_down: str | None = None) -> str:
    """The id that every process of this launch computes alike.

    Parameters
    ----------
    rendezvous : str, optional
        The address where the launchers of several nodes meet, which they all
        share when nothing else does (launchers started by hand).
    handed_down : str, optional
        The id the launcher handed this rank (its ``LaunchEnv.run_id``).

    Returns
    -------
    str
        The id: the handed-down one, SLURM's job id, the rendezvous, or this
        launcher's own.
    """
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
    """Hold the run's work_dir for the ``with`` block (``owner``), or check it is free.

    ``this_run`` is the run id (:func:`run id <run_id>`) the lock holds, and
    that a launcher hands its ranks. Nothing happens without settings (a
    pipeline with no work_dir). A ``launcher``
    keeps no heartbeat thread: its rank 0 keeps the heartbeat of the lock it
    holds. The block gets the lock
    (:class:`~flexgraph.training.output.WorkDirLock`; ``None`` when this process
    only checked), whose owner also removes what runs that did not end left in
    the work_dir's watch folders (:mod:`flexgraph.cli.watch_folder`).
    """
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
