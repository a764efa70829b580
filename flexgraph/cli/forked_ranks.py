"""Ranks forked from one process that imported their modules, instead of each starting afresh.

A rank of ``flexgraph run --nproc-per-node N`` spends most of its first seconds
importing: torch, mmengine, flexgraph and the strategy's library take 5 s of CPU
on a DDP rank and 7.5 s on a DeepSpeed one (measured on a 2-core machine), all
ranks at once, and again for every restart. So on a machine without an
accelerator the launcher starts its ranks as Python's ``multiprocessing``
forkserver starts processes: one server process imports those modules once
(:data:`PRELOAD_VAR` lists them, :mod:`flexgraph.cli._preload` imports them),
and every rank, restarted ones included, is a fork of that server. The server
is single-threaded and started before the agent, so a fork copies no lock held
by another thread. torch's elastic agent supports it for a function entrypoint
(``start_method='forkserver'``); :func:`flexgraph.cli.main.run_forked_rank` is
that function.

With CUDA (or any accelerator) every rank is a fresh interpreter, as torchrun
starts a script: CUDA does not work in a process forked after it was
initialised, and importing mmengine already asks CUDA for its devices.
``flexgraph run --start-method exec|forkserver`` chooses explicitly.

A forked rank behaves as a started one: it leads its own session (the agent
signals it alone, a terminal's Ctrl-C reaches the launcher only), its
``multiprocessing`` start method is the platform's default (its dataloader
workers fork from it) and its temporary folder its own, its output is
line-buffered, and its exit status is its run's.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from collections.abc import Sequence

PRELOAD_VAR = "FLEXGRAPH_PRELOAD"
"""The modules the rank server imports (comma-separated), set by the launcher."""

EVERY_RANK_IMPORTS = ("flexgraph.cli.main", "flexgraph.cli.run_cmd", "flexgraph.cli.launch",
                      "flexgraph.training.steps", "mmengine.visualization")
"""What every rank of a training config imports, whatever its strategy."""

START_METHODS = ("auto", "forkserver", "exec")


def choose_start_method(requested: str) -> str:
    """``forkserver`` or ``exec``: ``auto`` forks on Linux when no accelerator is present."""
    if requested != "auto":
        return requested
    if sys.platform != "linux":
        return "exec"
    return "exec" if _accelerators() else "forkserver"


def _accelerators() -> int:
    """Devices of torch's accelerator (CUDA, XPU, ...): asked here, in the launcher, which
    forks nothing; the rank server is a fresh interpreter."""
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch>=2.6
    if accelerator is not None:
        return accelerator.device_count()
    return torch.cuda.device_count()


def start_rank_server(modules: Sequence[str]) -> None:
    """Start the forkserver now, importing ``modules`` and :data:`EVERY_RANK_IMPORTS`.

    Started before the rendezvous, so that its imports overlap the launcher's own
    work; the agent's first rank waits for them.
    """
    os.environ[PRELOAD_VAR] = ",".join(dict.fromkeys([*EVERY_RANK_IMPORTS, *modules]))
    multiprocessing.set_forkserver_preload(["flexgraph.cli._preload"])
    multiprocessing.forkserver.ensure_running()


def become_forked_rank() -> None:
    """Make this fork of the rank server a rank as a started one would be.

    Called first by a forked rank's entrypoint
    (:func:`flexgraph.cli.main.run_forked_rank`).
    """
    os.setsid()
    # The server set multiprocessing's start method to its own; a fresh interpreter has
    # the platform's default (dataloader workers fork on Linux, not through a server).
    multiprocessing.set_start_method(None, force=True)
    # Nor its temporary folder, which the server removes when it exits, maybe before
    # this rank's dataloader workers remove their sockets in it: a fresh one, made on
    # first use, as in a fresh interpreter.
    multiprocessing.current_process()._config.pop("tempdir", None)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)


def end_forked_rank(status: int) -> None:
    """End a forked rank with ``status``: 0 returns, so that the agent collects its result.

    multiprocessing then ends the process with ``os._exit`` (no interpreter
    teardown, as :func:`~flexgraph.cli.stopping.end_launched_rank` does for a
    started rank); any other status is the process's exit status.
    """
    from flexgraph.training.components import end_dataloader_workers

    end_dataloader_workers()  # multiprocessing's exit waits for its children otherwise
    if status:
        sys.exit(status)


def is_forked_rank() -> bool:
    """This process is a rank that :func:`run_rank` runs (a multiprocessing child)."""
    return multiprocessing.parent_process() is not None
