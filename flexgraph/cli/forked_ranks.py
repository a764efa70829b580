"""Ranks forked from one process that imported their modules, instead of each starting afresh.

A rank of ``flexgraph run --nproc-per-node N`` spends most of its first seconds
importing: torch, mmengine, flexgraph and the strategy's library take 5 s of CPU
on a DDP rank and 7.5 s on a DeepSpeed one (measured on a 2-core machine), all
ranks at once, and again for every restart. So on a machine without an
accelerator the launcher starts its ranks as Python's ``multiprocessing``
forkserver starts processes: every rank, restarted ones included, is a fork of
one server process that imported those modules once. torch's elastic agent
supports it for a function entrypoint (``start_method='forkserver'``);
:func:`flexgraph.cli.main.run_forked_rank` is that function.

The server is itself a fork of the launcher, taken before the agent starts:
the launcher imported torch and mmengine to plan the run, and a fresh server
would import them again (3 s of CPU a launch). It is forked only from a
single-threaded launcher (a fork copies no lock that another thread holds) and
on a Python whose forkserver this module knows (:func:`_fork_server`);
otherwise multiprocessing starts the server as a fresh interpreter, which
imports the modules itself (:data:`~flexgraph.training.output.PRELOAD_VAR`,
:mod:`flexgraph.cli._preload`).

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

import contextlib
import importlib
import inspect
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import traceback
from collections.abc import Iterable, Sequence
from multiprocessing import connection, resource_tracker
from typing import NoReturn

from flexgraph.training.output import PRELOAD_VAR

EVERY_RANK_IMPORTS = ("flexgraph.cli.main", "flexgraph.cli.run_cmd", "flexgraph.cli.launch",
                      "flexgraph.training.steps", "mmengine.visualization",
                      "matplotlib.figure", "matplotlib.backends.backend_agg", "torch._dynamo")
"""What every rank of a training config imports, whatever its strategy: besides flexgraph's
and mmengine's modules, what they import on first use (mmengine's ``Visualizer`` builds a
matplotlib figure, 0.6 s; a torch optimizer's constructor imports ``torch._dynamo``, 0.8 s)."""

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
    """Start the rank server now, with ``modules`` and :data:`EVERY_RANK_IMPORTS` imported.

    Called before the agent starts (so before any thread of its own). This process
    imports the modules and forks the server from itself where it may
    (:func:`_fork_server`); otherwise the server is a fresh interpreter that imports
    them, and the agent's first rank waits for it.
    """
    names = list(dict.fromkeys([*EVERY_RANK_IMPORTS, *modules]))
    if _knows_forkserver():
        import_quietly(names)
        if _single_threaded():
            _fork_server()
            return
    os.environ[PRELOAD_VAR] = ",".join(names)
    multiprocessing.set_forkserver_preload(["flexgraph.cli._preload"])
    multiprocessing.forkserver.ensure_running()


def import_quietly(names: Iterable[str]) -> None:
    """Import each module of ``names``, leaving out those that fail: a rank imports them
    again and reports the failure as usual."""
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _knows_forkserver() -> bool:
    """This Python's forkserver starts as :func:`_fork_server` does it (3.10 to 3.13; 3.14
    adds an authentication key, and its server is left to multiprocessing)."""
    server = multiprocessing.forkserver._forkserver
    params = list(inspect.signature(multiprocessing.forkserver.main).parameters)
    return (params == ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]
            and not hasattr(server, "_forkserver_authkey")
            and all(hasattr(server, name) for name in _SERVER_STATE))


_SERVER_STATE = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid")


def _single_threaded() -> bool:
    """One thread in this process, Python's or any library's."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _fork_server() -> None:
    """Fork multiprocessing's forkserver from this process, as ``ensure_running`` spawns it.

    The same listening socket and "alive" pipe as multiprocessing makes (the server
    exits when the launcher's end of the pipe closes), and the same loop
    (``multiprocessing.forkserver.main``), run in a fork instead of a fresh
    interpreter; the client side (the agent's ``forkserver`` processes) finds the
    server where multiprocessing records it.
    """
    server = multiprocessing.forkserver._forkserver
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(alive_w)
            _serve(listener.fileno(), alive_r)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


def _serve(listener_fd: int, alive_r: int) -> NoReturn:
    """The forked server: multiprocessing's loop, with the launcher's signal handlers reset
    as a fresh interpreter has them, ending without the launcher's exit handlers."""
    for number in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):
                fresh = signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL
                signal.signal(number, fresh)
    status = 0
    try:
        multiprocessing.forkserver.main(listener_fd, alive_r, [])
    except SystemExit:  # the launcher is gone
        pass
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)


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
    """This process is a rank forked from the rank server, which
    :func:`flexgraph.cli.main.run_forked_rank` runs (a multiprocessing child)."""
    return multiprocessing.parent_process() is not None
