"""Launching ranks with torch's elastic agent, and reporting what happens to them.

The launcher runs torch's ``LocalElasticAgent`` with torchrun's own parser, and
turns the agent's monitor result and the ranks' error files into one line,
whatever the number of ranks: bad input exits 2 and is never restarted; a crash
names the rank, the step and the iteration, exit 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any

import attrs
from torch.distributed.elastic.agent.server.api import (
    RunResult,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

from flexgraph.cli import stopping
from flexgraph.cli.errors import DEBUG_HINT, describe_error
from flexgraph.cli.watch_folder import WatchFolder
from flexgraph.cli.watchdog import EXIT_AFTER_ANOTHER, EXIT_STALLED, failure_line
from flexgraph.core.executor import StepFailedError
from flexgraph.training.output import (
    LAUNCHER_PID_VAR,
    LaunchEnv,
    LaunchFacts,
    Progress,
    read_progress,
)

BAD_INPUT, CRASH = 2, 1


def is_launcher() -> bool:
    """This process launched ranks (it set ``LAUNCHER_PID_VAR`` to its own id)."""
    return os.environ.get(LAUNCHER_PID_VAR) == str(os.getpid())


class RankReport:
    """Executor hook of a launched rank: where it is, and what to say if it fails."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.step: str | None = None
        self.iteration: int | None = None
        self._progress = progress

    def before_step(self, step: Any, context: Mapping[str, Any]) -> None:
        self.step = step.name
        if self._progress is not None:
            self._progress.step(step.name)

    def on_error(self, step: Any, context: Mapping[str, Any], error: BaseException) -> None:
        self.step = step.name
        runner = getattr(context.get("hooks"), "runner", None)
        if step.name == "train" and runner is not None:
            self.iteration = int(runner.iter)  # iterations done when it failed

    def describe(self, exc: BaseException) -> dict[str, Any]:
        """What the launcher needs to report ``exc`` in one line."""
        status, message = describe_error(exc)
        cause = exc.__cause__ if isinstance(exc, StepFailedError) and exc.__cause__ else exc
        error = " ".join(f"{type(cause).__name__}: {cause}".split())
        return {"status": status, "message": message, "error": error, "step": self.step,
                "iteration": self.iteration, "time": time.time()}


class _RankErrorHandler(ErrorHandler):
    """torch elastic's error file (message, traceback, timestamp) plus flexgraph's report."""

    def __init__(self, report: RankReport) -> None:
        self.report = report

    def record_exception(self, e: BaseException) -> None:
        path = self._get_error_file_path()
        if not path:
            return
        data = {"message": {"message": f"{type(e).__name__}: {e}", "extraInfo": {
            "py_callstack": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
            "timestamp": str(int(time.time())),
            "flexgraph": self.report.describe(e),
        }}}
        # Whole or absent: the launcher reads every rank's file once a rank has failed, maybe
        # while the agent is stopping this one halfway through writing it.
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as f:
            json.dump(data, f)
        os.replace(partial, path)


def run_as_rank(run: Callable[[], int], report: RankReport, *, to_launcher: bool,
                debug: bool) -> int:
    """Run ``run()`` as one rank of a launched group; ``report`` is its executor hook.

    A failure goes to the rank's torch elastic error file; under flexgraph's
    launcher (``to_launcher``) the rank then exits quietly, as the launcher reports
    once for all; under plain ``torchrun`` it propagates.
    """
    handler = _RankErrorHandler(report)
    handler.initialize()  # torch's: a fatal signal (segfault) prints its traceback
    try:
        return run()
    except Exception as exc:
        handler.record_exception(exc)
        if not to_launcher:
            raise
        if debug:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        return describe_error(exc)[0]


@attrs.frozen
class Failure:
    rank: int
    status: int  # BAD_INPUT or CRASH
    line: str
    killed: bool  # by a signal: no error file, so it is likely what the others reacted to
    time: float


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _progress_text(progress: Mapping[str, Any]) -> str:
    text = f" in step {progress['step']!r}" if progress.get("step") else ""
    if progress.get("iter") is not None:
        text += (f" after at least {progress['iter']} iterations (progress is recorded at each "
                 f"log line, every {progress['every']} iterations)")
    return text


def _flexgraph_report(failure: ProcessFailure) -> dict[str, Any] | None:
    """What :meth:`RankReport.describe` put in the rank's error file, if it wrote one."""
    message = failure.error_file_data.get("message")
    return message.get("extraInfo", {}).get("flexgraph") if isinstance(message, dict) else None


def describe_failure(rank: int, failure: ProcessFailure, progress_dir: str | None) -> Failure:
    """Read what ``rank`` left (error file, progress record) into one :class:`Failure`."""
    info = _flexgraph_report(failure)
    if info:
        return Failure(rank, info["status"], failure_line(rank, info), False, info["time"])
    progress = read_progress(progress_dir, rank) if progress_dir else {}
    if failure.exitcode < 0:
        what = f"was killed by {_signal_name(failure.exitcode)}"
    elif failure.exitcode == 0:
        what = "exited with status 0 before its run finished"
    else:
        what = f"exited with status {failure.exitcode}"
    # Killed, or gone early without a word: what the others reacted to.
    return Failure(rank, CRASH, f"rank {rank} {what}{_progress_text(progress)}",
                   failure.exitcode <= 0, float(failure.timestamp))


def root_cause(failures: Mapping[int, ProcessFailure], progress_dir: str | None) -> Failure:
    """The failure to report among those of one attempt.

    One failure makes the agent SIGTERM the others, the waiting ranks fail on the
    closed connection, and watchdogs end the rest. So: bad input first; then a
    rank killed by a signal not the agent's own, nor one that followed another;
    then the earliest error.
    """
    described = [describe_failure(r, f, progress_dir) for r, f in sorted(failures.items())]
    bad = [f for f in described if f.status == BAD_INPUT]
    if bad:
        return min(bad, key=lambda f: f.time)
    stopped = {r for r, f in failures.items()
               if f.exitcode in (-signal.SIGTERM, EXIT_AFTER_ANOTHER)}
    causes = [f for f in described if f.rank not in stopped] or described
    return min(causes, key=lambda f: (not f.killed, f.time))


class _ReportingAgent(LocalElasticAgent):
    """torch's local agent, saying which rank failed and why each time the group fails.

    Bad input stops the restarts: the next attempt would fail the same way.
    """

    def __init__(self, *args: Any, progress_dir: str,
                 watch: Callable[[int], WatchFolder] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.progress_dir = progress_dir
        self.watch = watch
        self.failure: Failure | None = None
        self.restarts = 0
        self.stopped = False

    def _stop_workers(self, worker_group: WorkerGroup) -> None:
        """Stop the ranks within the grace period: torch's own stops wait 30 s whatever
        the agent's ``shutdown_timeout``.
        """
        self._shutdown(timeout=getattr(self, "_shutdown_timeout", 30))

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        pids = super()._start_workers(worker_group)
        _bound_close(self._pcontext, getattr(self, "_shutdown_timeout", 30))
        return pids

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = super()._monitor_workers(worker_group)
        result = self._vanished(result, worker_group)
        if not result.is_failed():
            return result
        self._add_ranks_that_left_errors(result, worker_group)
        if stopping.ranks_stopped(result.failures):  # saved on a signal: not to restart
            self.stopped, self._remaining_restarts = True, 0
            return result
        self.failure = (self._stall(worker_group.spec)
                        or root_cause(result.failures, self.progress_dir))
        if self.failure.status == BAD_INPUT:
            self._remaining_restarts = 0
        elif self._remaining_restarts > 0:
            self.restarts += 1
            print(f"warning: {self.failure.line}; restarting the group (restart "
                  f"{self.restarts} of {worker_group.spec.max_restarts}), which resumes "
                  f"from the last complete checkpoint", file=sys.stderr, flush=True)
        return result


    def _stall(self, spec: WorkerSpec) -> Failure | None:
        """The watchdog's report of this attempt, if the ranks stopped on a stall."""
        if self.watch is None:
            return None
        report = self.watch(spec.max_restarts - self._remaining_restarts).read_report()
        if report is None:
            return None
        return Failure(min(report.get("stuck") or [0]), EXIT_STALLED, report["line"], False,
                       float(report.get("time", time.time())))

    def _vanished(self, result: RunResult, worker_group: WorkerGroup) -> RunResult:
        """A group whose ranks all ended, some before their run's last word, has failed.

        Ranks that exit 0 early (``os._exit(0)`` in a hook) would count as done.
        """
        if result.state == WorkerState.HEALTHY:
            exits = _exit_statuses(self._pcontext)
            if not exits or any(status is None for status in exits.values()):
                return result
        elif result.state != WorkerState.SUCCEEDED:
            return result
        exits = _exit_statuses(self._pcontext)
        early = {}
        for worker in worker_group.workers:
            if not read_progress(self.progress_dir, worker.global_rank).get("done"):
                early[worker.global_rank] = ProcessFailure(
                    local_rank=worker.local_rank, pid=worker.id or -1,
                    exitcode=exits.get(worker.local_rank) or 0, error_file="")
        return RunResult(state=WorkerState.FAILED, failures=early) if early else result

    def _add_ranks_that_left_errors(self, result: RunResult, worker_group: WorkerGroup) -> None:
        """Count every rank that ended badly as failed, not only those the agent saw first."""
        files = getattr(self._pcontext, "error_files", None) or {}
        exits = _exit_statuses(self._pcontext)
        for worker in worker_group.workers:
            if worker.global_rank in result.failures:
                continue
            path = files.get(worker.local_rank) or ""
            status = exits.get(worker.local_rank)
            finished = read_progress(self.progress_dir, worker.global_rank).get("done")
            if (status is None or (status == 0 and finished)) and not os.path.isfile(path):
                continue
            try:
                failure = ProcessFailure(local_rank=worker.local_rank, pid=worker.id or -1,
                                         exitcode=status or CRASH, error_file=path)
            except ValueError:  # not JSON: written by something else than _RankErrorHandler
                failure = ProcessFailure(local_rank=worker.local_rank, pid=worker.id or -1,
                                         exitcode=status or CRASH, error_file="")
            info = _flexgraph_report(failure)
            if info and not status:
                failure.exitcode = info["status"]
            result.failures[worker.global_rank] = failure


def _bound_close(pcontext: Any, grace: float) -> None:
    """Have every stop of ``pcontext`` wait ``grace`` s before SIGKILL.

    torch's contexts stop the others from inside their own poll with a fixed default.
    """
    close = type(pcontext).close

    def bounded(death_sig: Any = None, timeout: float | None = None) -> None:
        close(pcontext, death_sig, grace if timeout is None else timeout)

    pcontext.close = bounded


def _exit_statuses(pcontext: Any) -> dict[int, int | None]:
    """``{local rank: exit status}`` of ``pcontext``'s ranks (None: running; negative: a signal)."""
    handlers = getattr(pcontext, "subprocess_handlers", None) or {}
    return {rank: handler.proc.poll() for rank, handler in handlers.items()}


def _torchrun_argv(args: argparse.Namespace, facts: LaunchFacts,
                   parser: argparse.ArgumentParser, stop_signals: Sequence[str] = ()
                   ) -> list[str]:
    """torchrun's flags for this launch, then ``-m flexgraph run`` with the user's own args."""
    launch = ["--nproc-per-node", str(args.nproc_per_node), "--nnodes", str(args.nnodes),
              "--max-restarts", str(args.max_restarts)]
    if any("--signals-to-handle" in a.option_strings for a in parser._actions):  # torch>=2.8
        launch += ["--signals-to-handle", stopping.launcher_signals(stop_signals)]
    if facts.master_addr or facts.master_port or args.nnodes != "1":
        launch += ["--node-rank", str(facts.node_rank)]
        launch += ["--master-addr", facts.master_addr or "127.0.0.1"]
        launch += ["--master-port", str(facts.master_port or 29500)]
    else:  # what torchrun's --standalone stands for (its run() sets these three)
        launch += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
                   "--rdzv-id", str(uuid.uuid4())]
    return launch + ["-m", "flexgraph", *_rank_argv(args, facts)]


def _rank_argv(args: argparse.Namespace, facts: LaunchFacts) -> list[str]:
    """A rank's ``flexgraph`` arguments: the user's own, nothing re-derived.

    ``--resume`` is the launch's (a requeued SLURM job's ``auto``).
    """
    child = ["run", args.config, "--entry", args.entry]
    given = {"work_dir": args.work_dir, "resume": facts.resume, "load_from": args.load_from,
             "strategy": args.strategy, "preempt_signal": args.preempt_signal,
             "launcher": args.launcher}
    for flag, value in given.items():
        if value:
            child += [f"--{flag.replace('_', '-')}", value]
    if args.cfg_options:
        child += ["--cfg-options", *args.cfg_options]
    debug = ["--debug"] if args.debug else []
    return [*debug, *child]


def _quiet_torch_logs() -> None:
    """torch elastic logs every failure and SIGTERM it sends; the launcher says it once."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith(("torch.distributed", "torch.multiprocessing")) and isinstance(
                logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)


def _run_agent(torch_args: argparse.Namespace, progress_dir: str, quiet: bool,
               grace: float,
               watch: Callable[[int], WatchFolder] | None) -> _ReportingAgent:
    """torchrun's ``run`` and ``launch_agent``, with our agent.

    torchrun builds ``LocalElasticAgent`` itself, so its wiring is repeated here;
    ``LaunchConfig`` options shared with ``WorkerSpec`` pass through by name, so
    newer knobs keep working.
    """
    import inspect

    import torch.distributed.elastic.rendezvous.registry as rdzv_registry
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    from torch.distributed.run import config_from_args

    if quiet:
        _quiet_torch_logs()  # config_from_args warns about OMP_NUM_THREADS
    config, entrypoint, entry_args = config_from_args(torch_args)
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
    config.shutdown_timeout = grace
    rdzv = RendezvousParameters(
        backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
        min_nodes=config.min_nodes, max_nodes=config.max_nodes, local_addr=config.local_addr,
        **config.rdzv_configs)
    master_addr, master_port = None, None
    if rdzv.backend == "static":
        master_addr, master_port = parse_rendezvous_endpoint(rdzv.endpoint, default_port=-1)
    if hasattr(config, "signals_to_handle"):
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
    shared = {f.name for f in fields(WorkerSpec)} & {f.name for f in fields(type(config))}
    spec = WorkerSpec(
        **{name: getattr(config, name) for name in shared},
        local_world_size=config.nproc_per_node, entrypoint=entrypoint, args=tuple(entry_args),
        rdzv_handler=rdzv_registry.get_rendezvous_handler(rdzv),
        master_addr=master_addr, master_port=master_port)
    accepted = inspect.signature(LocalElasticAgent.__init__).parameters
    options = {name: getattr(config, name) for name in ("start_method", "log_line_prefix_template",
                                                        "shutdown_timeout")
               if name in accepted and hasattr(config, name)}
    agent = _ReportingAgent(spec=spec, logs_specs=config.logs_specs, progress_dir=progress_dir,
                            watch=watch, **options)
    from torch.distributed.elastic.multiprocessing.api import SignalException

    if quiet:
        _quiet_torch_logs()  # now: the rendezvous modules made their loggers just above
    shutdown = True
    try:
        result = agent.run()
        if not result.is_failed():
            agent.failure = None
        return agent
    except SignalException:
        shutdown = False  # as torchrun: a signalled agent leaves the rendezvous open
        raise
    finally:
        if shutdown:
            spec.rdzv_handler.shutdown()


def launch(args: argparse.Namespace, facts: LaunchFacts, handed_down: LaunchEnv,
           stop_signals: Sequence[str] = (), on_stop: Callable[[str], None] | None = None,
           settings: Any = None, run_id: str | None = None) -> int:
    """Start the ranks through torch's elastic agent; return the run's exit status.

    ``handed_down`` is the ranks' environment; ``stop_signals`` are forwarded
    besides :data:`~flexgraph.cli.stopping.FORWARDED`, and ``on_stop`` is told the
    signal's name once the ranks saved (a SLURM job asks to be requeued).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import get_args_parser

    from flexgraph.training.config import watch_policy

    parser = get_args_parser()
    torch_args = parser.parse_args(_torchrun_argv(args, facts, parser, stop_signals))
    quiet = not args.debug and "LOGLEVEL" not in os.environ
    grace = (settings.watch if settings is not None else watch_policy(None)).shutdown_timeout
    watch = None
    if settings is not None and run_id is not None:
        def watch(attempt: int) -> WatchFolder:
            return WatchFolder.of_run(settings.work_dir, run_id, attempt)
    with tempfile.TemporaryDirectory(prefix="flexgraph-ranks-") as progress_dir:
        handed_down = attrs.evolve(handed_down, progress_dir=progress_dir,
                                   launcher_pid=str(os.getpid()))
        os.environ.update(handed_down.variables())  # the agent starts the ranks with them
        if args.max_restarts > 0:
            # The agent's shared TCPStore outlives a restart with the failed attempt's
            # keys in it, and restarted ranks then connect to addresses of dead ones
            # (pytorch/pytorch#135712); torch's own switch gives each attempt a fresh store.
            os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        try:
            agent = _run_agent(torch_args, progress_dir, quiet, grace, watch)
        except SignalException as exc:  # the agent forwarded it and waited for the ranks
            note = stopping.stop_note(progress_dir)
            if note:  # the ranks saved
                stopping.say_stopped(note)
                if on_stop is not None:
                    on_stop(exc.sigval.name)
                return stopping.EXIT_STOPPED
            print(f"error: stopped by {exc.sigval.name} before the ranks saved a checkpoint "
                  f"(ranks still running {grace:g} s later were killed: "
                  f"env_cfg.shutdown_timeout); --resume auto continues from the last "
                  f"complete one", file=sys.stderr)
            return 128 + int(exc.sigval)
        note = stopping.stop_note(progress_dir)
    if agent.stopped:
        stopping.say_stopped(note or "the ranks stopped on a signal and saved a checkpoint")
        return stopping.EXIT_STOPPED
    failure = agent.failure
    if failure is None:
        return 0
    line = failure.line
    if agent.restarts:
        line += f"; gave up after {agent.restarts} restart{'s' if agent.restarts > 1 else ''}"
    print(f"error: {line}", file=sys.stderr)
    if failure.status == CRASH and not args.debug:
        print(DEBUG_HINT, file=sys.stderr)
    if failure.status == EXIT_STALLED:
        print("flexgraph: --resume auto continues from the last complete checkpoint",
              file=sys.stderr)
    return failure.status
