"""The progress watchdog: a run that stops making progress is found, named and stopped.

A rank blocked in a data read, a hook or a deadlock leaves the others waiting
in a collective until the group's timeout, with nothing said about who was at
fault. Each process's :class:`Watchdog` thread writes heartbeats; the first
past its limit gathers every rank's stacks (:data:`STACKS_SIGNAL`, answered by
:mod:`faulthandler` even when Python is stuck), names the stuck ranks in one
line, and every process exits :data:`EXIT_STALLED`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import socket
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from flexgraph.cli.errors import describe_error
from flexgraph.cli.watch_folder import CLAIM, REPORT, WatchFolder
from flexgraph.core.executor import StepFailedError

EXIT_STALLED = 3
"""Exit status of a run the watchdog stopped (every rank's, and the launcher's)."""
STACKS_SIGNAL = signal.SIGRTMIN + 3
"""The signal that has a watched process write its stacks: a real-time signal,
which no scheduler sends and no preemption setting names.
"""
EXIT_AFTER_ANOTHER = 86
"""Exit status of a launcher's rank that ended because another rank failed first
(the launcher reports that one).
"""
BAD_INPUT = 2
_COLLECTIVES = tuple(os.sep.join(("", *parts, "")) for parts in (
    ("torch", "distributed"),  # every collective, the process group's barrier
    ("torch", "autograd"),  # backward, where DDP's reducer waits for its all-reduces
    ("deepspeed", "comm"),
))
"""Where a main thread's innermost frame is when it waits for the other ranks."""
_TRANSPORT_ERRORS = ("/gloo/transport/", "Connection reset by peer", "Connection closed by peer",
                     "Broken pipe")
"""Text of the errors a collective raises when another rank's process ended (gloo's)."""
CAUSE_WAIT = 2.0
"""Seconds a rank whose collective lost its peer looks for that peer's end before
reporting its own error: a killed process closes its sockets before it is gone.
"""


def beat_interval(bound: float) -> float:
    """Seconds between two heartbeats for an iteration bound of ``bound`` seconds.

    Examples
    --------
    >>> beat_interval(300), beat_interval(20), beat_interval(2)
    (5.0, 2.0, 0.5)
    """
    return min(5.0, max(0.5, bound / 10))


def _library_folders() -> tuple[str, ...]:
    """Folders whose code is not the user's: Python's, the installed packages', flexgraph's."""
    import importlib.util

    import flexgraph

    paths = sysconfig.get_paths()
    folders = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    folders.add(os.path.dirname(os.path.abspath(flexgraph.__file__)))
    spec = importlib.util.find_spec("flexgraph.strategies")
    folders.update(spec.submodule_search_locations or () if spec else ())
    return tuple(os.path.join(os.path.abspath(f), "") for f in folders)


def _frame_text(frame: Any) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"


def innermost_user_frame(frames: list[Any], libraries: tuple[str, ...]) -> str | None:
    """``file.py:line function`` of the innermost frame outside ``libraries``, else the first."""
    for frame in frames:
        name = frame.f_code.co_filename
        if not name.startswith(("<", *libraries)):
            return _frame_text(frame)
    return _frame_text(frames[0]) if frames else None


def _process_gone(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError):
        return False
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def lost_a_peer(exc: BaseException) -> bool:
    """Whether ``exc``, or its cause, is the error a collective raises when a peer ended.

    Examples
    --------
    >>> lost_a_peer(RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: "
    ...                          "Connection reset by peer"))
    True
    """
    dist = sys.modules.get("torch.distributed")
    kinds = tuple(getattr(dist, name) for name in ("DistNetworkError", "DistBackendError")
                  if hasattr(dist, name))
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if (kinds and isinstance(exc, kinds)) or any(text in str(exc)
                                                     for text in _TRANSPORT_ERRORS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _say(line: str) -> None:
    """``error: line`` on stderr, without Python's stream locks (the main thread may hold them)."""
    with contextlib.suppress(OSError):
        os.write(2, f"error: {line}\n".encode())


def _kill_children() -> None:
    """SIGKILL this process's children (dataloader workers): they must not outlive it."""
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError, ValueError), open(
                    f"/proc/self/task/{task}/children") as f:
                for pid in f.read().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request: nothing will tell
        os.kill(os.getpid(), signal.SIGKILL)


def failure_line(rank: int, failure: Mapping[str, Any]) -> str:
    """The one line that reports rank ``rank``'s failure, as the rank recorded it."""
    if failure["status"] == BAD_INPUT:
        return failure["message"]
    where = f" in step {failure['step']!r}" if failure.get("step") else ""
    if failure.get("iteration") is not None:
        where += f" after {failure['iteration']} iterations"
    return f"rank {rank} failed{where}: {failure['error']}"


def _position(beat: Mapping[str, Any]) -> str:
    doing = {"evaluation": ", evaluating", "save": ", saving a checkpoint"}.get(
        beat.get("phase"), "")
    if beat.get("iteration") is not None:
        return f"at iteration {beat['iteration']}{doing}"
    return f"in step {beat['step']!r}{doing}" if beat.get("step") else "before its first step"


def _shown(path: Path) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def compose_report(beats: Mapping[int, Mapping[str, Any]], world_size: int,
                   answered: Iterable[int], gone: Iterable[int], now: float,
                   stacks: Path) -> dict[str, Any]:
    """The stall's report: ``line``, ``stuck`` (the ranks named) and ``stacks`` (the folder).

    ``answered``: the ranks that wrote stacks; ``gone``: those whose process ended.
    """
    answered, gone = set(answered), set(gone)
    silent = [r for r in range(world_size) if r not in answered]
    stuck = sorted({*silent, *(r for r in answered if not beats.get(r, {}).get("waiting"))})
    deadlock = not stuck
    if deadlock:
        stuck = list(range(world_size))

    def says(rank: int) -> str:
        beat = beats.get(rank, {})
        position = _position(beat)
        if rank in gone:
            return (f"rank {rank} is gone: its process ended without a word (killed?), last "
                    f"seen {position}")
        if rank not in answered:
            quiet = now - float(beat.get("beat", now))
            return (f"rank {rank} is not responding: no heartbeat for {quiet:.0f} s, last seen "
                    f"{position} (a stopped process, or one stuck outside Python: it wrote "
                    f"no stack)")
        age = now - float(beat.get("since", now))
        text = f"rank {rank} made no progress for {age:.0f} s {position}"
        return f"{text}, in {beat['where']}" if beat.get("where") else text

    line = "; ".join(says(rank) for rank in stuck)
    if deadlock:
        line = f"every rank waits in a collective that another never joined: {line}"
    whose = "every rank" if not silent else "the ranks that answered"
    line += f" (stacks of {whose}: {_shown(stacks)}{os.sep})"
    return {"line": line, "stuck": stuck, "stacks": str(stacks), "time": now}


class Watchdog:
    """The watchdog of one process of a run: an executor hook with a thread of its own.

    ``quiet``: a launcher reports for this process; ``release`` frees the work_dir's lock.
    """

    def __init__(self, policy: Any, folder: WatchFolder, *, rank: int, world_size: int,
                 quiet: bool = False, release: Callable[[], None] | None = None) -> None:
        self.policy = policy
        self.folder = folder
        self.rank = rank
        self.world_size = world_size
        self.quiet = quiet
        self._release = release
        self._host = socket.gethostname()
        self._main = threading.main_thread().ident
        self._libraries = _library_folders()
        # What the main thread updates (plain attribute stores, read by the thread).
        self._step: str | None = None
        self._step_events = 0
        self._runner: Any = None
        self._train_start = 0  # the train step's starting iteration (a resume's)
        self._run_dir: Path | None = None
        self._log: Path | None = None
        self._done = False
        self._failed = False
        # The thread's own.
        self._key: Any = None
        self._since = time.time()
        self._phase = "setup"
        self._iteration: int | None = None  # the iteration under way, counted from 1
        self._where: str | None = None
        self._waiting = False
        self._collectives = False  # the flight recorder keeps this process's collectives
        self._slowest = 0.0
        self._answered = False
        self._peers: dict[int, Mapping[str, Any]] = {}
        self._codes: dict[Any, str] = {}
        self._stopping = threading.Event()
        self._ending = threading.Lock()
        self._thread: threading.Thread | None = None
        self._beat_fd = -1
        self._beat_size = 0
        self._stacks_file: Any = None

    def before_step(self, step: Any, context: Mapping[str, Any]) -> None:
        self._step, self._step_events = step.name, self._step_events + 1
        hooks = context.get("hooks")
        if hooks is not None and self._runner is None:
            self._runner = getattr(hooks, "runner", None)
        if step.name == "train" and "loop_state" in context:
            self._train_start = int(getattr(context["loop_state"], "iter", 0))
        record = getattr(context.get("run_context"), "record", None)
        if record is not None and self._run_dir is None and self.rank == 0:
            self._run_dir = Path(record.run_dir)
            self._log = self._run_dir / f"{record.timestamp}.log"
        with contextlib.suppress(OSError):  # where a process that stops answering was last
            self._write_beat(time.time(), step=step.name)

    def after_step(self, step: Any, context: Mapping[str, Any], record: Any) -> None:
        self._step_events += 1

    @property
    def interval(self) -> float:
        return beat_interval(self.policy.iteration_bound())

    def start(self) -> Watchdog:
        stacks = self.folder.stacks_path(self.rank)
        self._stacks_file = open(stacks, "w")  # noqa: SIM115 (faulthandler writes into it)
        self._stacks_file.write(f"rank {self.rank}, process {os.getpid()} on {self._host}; "
                                f"its main thread is Thread 0x{self._main:016x}\n")
        self._stacks_file.flush()
        faulthandler.register(STACKS_SIGNAL, file=self._stacks_file, all_threads=True,
                              chain=False)
        self._beat_fd = os.open(self.folder.beat_path(self.rank),
                                os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._write_beat(time.time())
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="flexgraph-watchdog")
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread; the last heartbeat says this process is done."""
        self._done = True
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with contextlib.suppress(OSError):
            self._write_beat(time.time())
            os.close(self._beat_fd)

    def _watch(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self._look(time.time())
            except Exception as exc:  # the watchdog must outlive any surprise of its own
                with contextlib.suppress(OSError):
                    os.write(2, f"warning: flexgraph's watchdog: {exc!r}\n".encode())

    def _look(self, now: float) -> None:
        self._sample(now)
        names = self.folder.events()
        if REPORT in names:
            self._end_if_reported()
        if CLAIM in names:
            self._answer()
            self._take_over_a_lost_report(now)
        failures = {r: f for r, f in self.folder.read_failures(names).items()
                    if r != self.rank}
        if failures and not self._failed:
            self._end_after_failure(failures)
        gone = self._vanished_peers()
        if gone and not self._failed:
            self._end_after_vanished(gone)
        self._write_beat(now)
        if now - self._since > self.policy.limit(self._phase, self._slowest):
            self._report_stall()

    def _phase_codes(self) -> dict[Any, str]:
        if not self._codes:
            from flexgraph.training.checkpoint import Checkpointer
            from flexgraph.training.loop import TrainLoop, run_evaluation

            self._codes = {run_evaluation.__code__: "evaluation",
                           TrainLoop.save_checkpoint.__code__: "save",
                           Checkpointer.save.__code__: "save",
                           Checkpointer.finish_pending.__code__: "save"}
        return self._codes

    def _main_frames(self) -> list[Any]:
        frame = sys._current_frames().get(self._main)
        frames = []
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        return frames  # innermost first

    def _sample(self, now: float) -> None:
        frames = self._main_frames()
        codes = self._phase_codes()
        marked = [(codes[f.f_code], f) for f in frames if f.f_code in codes]
        runner, iteration, batch = self._runner, None, None
        phase = "setup"
        if marked:
            phase, frame = marked[-1]  # the outermost: a save inside an evaluation is one
            if phase == "evaluation":
                batch = frame.f_locals.get("count")
        if self._step == "train" and runner is not None:
            iteration = int(runner.iter)
            if not marked and iteration < int(getattr(runner, "max_iters", 0) or 1 << 62):
                phase = "first iteration" if iteration <= self._train_start else "iteration"
        key = (self._step_events, iteration, batch)
        debugging = any(f.f_trace is not None for f in frames)  # pdb: not a stall
        if key != self._key or debugging:
            same_step = self._key is not None and key[0] == self._key[0]
            if same_step and self._phase == phase == "iteration":  # one more iteration done
                self._slowest = max(self._slowest, now - self._since)
            self._key, self._since = key, now
        self._phase = "setup" if self._done else phase
        self._iteration = None if iteration is None else iteration + 1
        self._where = innermost_user_frame(frames, self._libraries)
        self._waiting = bool(frames) and any(part in frames[0].f_code.co_filename
                                             for part in _COLLECTIVES)
        self._collectives = self._records_collectives()

    def _write_beat(self, now: float, step: str | None = None) -> None:
        import json

        beat = {"rank": self.rank, "pid": os.getpid(), "host": self._host, "beat": now,
                "since": self._since, "phase": self._phase, "step": step or self._step,
                "iteration": self._iteration, "where": self._where, "waiting": self._waiting,
                "limit": self.policy.limit(self._phase, self._slowest), "done": self._done,
                "collectives": self._collectives,
                "run_dir": str(self._run_dir) if self._run_dir else None}
        data = json.dumps(beat).encode()
        self._beat_size = max(self._beat_size, len(data))
        os.pwrite(self._beat_fd, data.ljust(self._beat_size), 0)

    def _answer(self) -> None:
        """Write this process's stacks (once per stall) and its collectives' record."""
        if self._answered:
            return
        self._answered = True
        stacks = self.folder.stacks_path(self.rank)
        with contextlib.suppress(OSError):
            if b"most recent call first" not in stacks.read_bytes():  # no signal came
                faulthandler.dump_traceback(self._stacks_file, all_threads=True)
        self._dump_collectives()
        self._write_beat(time.time())

    def _records_collectives(self) -> bool:
        size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get(
            "TORCH_NCCL_TRACE_BUFFER_SIZE")
        if not size or size == "0" or "torch.distributed" not in sys.modules:
            return False
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def _dump_collectives(self) -> None:
        """The flight recorder's record of this rank's collectives, or why there is none."""
        if not self._records_collectives():
            return
        import torch

        c10d = torch._C._distributed_c10d
        nccl = torch.distributed.get_backend() == "nccl"
        path = self.folder.stacks / f"collectives_rank{self.rank}.pkl"
        why = "this torch has no flight recorder dump"
        for name in ("_dump_nccl_trace", "_dump_fr_trace") if nccl else ("_dump_fr_trace",):
            dump = getattr(c10d, name, None)
            if dump is not None:
                try:
                    path.write_bytes(dump())
                    return
                except Exception as exc:  # noqa: BLE001 (the stacks matter more)
                    why = f"{name}: {type(exc).__name__}: {exc}"
        with contextlib.suppress(OSError):  # the reporter waits for one or the other
            path.with_suffix(".error").write_text(why + "\n")

    def _answered_ranks(self, beats: Mapping[int, Mapping[str, Any]]) -> set[int]:
        answered = {r for r, beat in beats.items() if beat.get("done")}
        for rank in range(self.world_size):
            with contextlib.suppress(OSError):
                stacks = self.folder.stacks_path(rank).read_bytes()
                collectives = self.folder.stacks / f"collectives_rank{rank}.pkl"
                if b"most recent call first" in stacks and (
                        not beats.get(rank, {}).get("collectives") or collectives.exists()
                        or collectives.with_suffix(".error").exists()):
                    answered.add(rank)
        return answered

    def _report_stall(self) -> None:
        """If first to claim: gather every rank's stacks, name the stuck ones, end the run."""
        if not self.folder.claim(self.rank):
            return
        self._answer()
        beats = self.folder.read_beats()
        local = {r: b for r, b in beats.items()
                 if b.get("host") == self._host and r != self.rank and not b.get("done")}
        for beat in local.values():
            with contextlib.suppress(OSError):
                os.kill(int(beat["pid"]), STACKS_SIGNAL)
        deadline = time.time() + 2 * self.interval + 2
        while len(self._answered_ranks(beats)) < self.world_size and time.time() < deadline:
            time.sleep(0.1)
            beats = self.folder.read_beats()
        time.sleep(0.2)  # a stack being written when it was seen
        self._publish(self.folder.read_beats())

    def _publish(self, beats: Mapping[int, Mapping[str, Any]]) -> None:
        answered = self._answered_ranks(beats)
        gone = {r for r, b in beats.items()
                if b.get("host") == self._host and not b.get("done") and _process_gone(b["pid"])}
        run_dir = beats.get(0, {}).get("run_dir")
        stacks = (self.folder.copy_stacks(Path(run_dir) / "stacks") if run_dir
                  else self.folder.stacks)
        report = compose_report(beats, self.world_size, answered - gone, gone, time.time(),
                                Path(stacks).absolute() if run_dir else stacks)
        self.folder.write_report(report)
        if not self.quiet:  # now: once the report is out, this process may end any time
            _say(report["line"])
        self._end_silent_ranks({r: b for r, b in beats.items() if r not in answered})
        self._end(EXIT_STALLED, report["line"])

    def _end_silent_ranks(self, silent: Mapping[int, Mapping[str, Any]]) -> None:
        """End this host's ranks that wrote no stack: continue a stopped one, then kill."""
        pids = [int(b["pid"]) for r, b in silent.items()
                if b.get("host") == self._host and r != self.rank and not b.get("done")]
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        deadline = time.time() + self.interval + 2
        while time.time() < deadline and not all(_process_gone(pid) for pid in pids):
            time.sleep(0.1)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _take_over_a_lost_report(self, now: float) -> None:
        """A claim without a report long after it: its reporter died; report in its place."""
        claim = self.folder.read_claim() or {}
        if now - float(claim.get("time", now)) < 4 * self.interval + 15:
            return
        if self.folder.read_report() is None:
            self._publish(self.folder.read_beats())

    def failed(self, exc: BaseException) -> None:
        """The run raised ``exc`` on the main thread: end here if another rank failed first.

        Otherwise record this failure and return. A transport error waits up to
        :data:`CAUSE_WAIT` for a killed peer to show, since its sockets close first.
        """
        now = time.time()
        deadline = now + (CAUSE_WAIT if self.world_size > 1 and lost_a_peer(exc) else 0.0)
        while True:
            names = self.folder.events()
            if REPORT in names:
                self._end_if_reported()
            earlier = {r: f for r, f in self.folder.read_failures(names).items()
                       if r != self.rank and float(f.get("time", now)) <= now}
            if earlier:
                self._end_after_failure(earlier)
            gone = self._vanished_peers()
            if gone:
                self._end_after_vanished(gone)
            if time.time() >= deadline:
                break
            time.sleep(0.05)
        self._failed = True
        status, message = describe_error(exc)
        cause = exc.__cause__ if isinstance(exc, StepFailedError) and exc.__cause__ else exc
        runner = self._runner
        iteration = int(runner.iter) if self._step == "train" and runner is not None else None
        self.folder.write_failure(self.rank, {
            "status": status, "message": message, "step": self._step, "iteration": iteration,
            "error": " ".join(f"{type(cause).__name__}: {cause}".split()), "time": now,
            "pid": os.getpid(), "host": self._host})

    def _printer(self, failed: Iterable[int]) -> bool:
        """Whether this process says another's failure: the lowest survivor, without a launcher."""
        failed = set(failed)
        survivors = [r for r in range(self.world_size) if r not in failed]
        return not self.quiet and bool(survivors) and survivors[0] == self.rank

    def _end_after_failure(self, failures: Mapping[int, Mapping[str, Any]]) -> None:
        self._end_if_reported()
        rank = min(failures, key=lambda r: float(failures[r].get("time", 0)))
        first = failures[rank]
        if self.quiet and first.get("host") == self._host:
            # Its launcher reads its error file, which it writes after this record: this
            # rank ends once that one is gone (the launcher then stops every other rank).
            deadline = time.time() + self.interval + 2
            while time.time() < deadline and not _process_gone(first.get("pid")):
                time.sleep(0.1)
        status = EXIT_AFTER_ANOTHER if self.quiet else int(first.get("status", 1))
        self._end(status, failure_line(rank, first), say=self._printer(failures))

    def _vanished_peers(self) -> dict[int, Mapping[str, Any]]:
        if len(self._peers) < self.world_size - 1:
            self._peers = {r: b for r, b in self.folder.read_beats().items()
                           if r != self.rank and b.get("host") == self._host}
        gone = {}
        for rank, beat in self._peers.items():
            if _process_gone(beat["pid"]):
                last = self.folder.read_beats().get(rank, beat)
                if not last.get("done"):
                    gone[rank] = last
        return gone

    def _end_after_vanished(self, gone: Mapping[int, Mapping[str, Any]]) -> None:
        self._end_if_reported()
        rank = min(gone)
        line = (f"rank {rank} ended without reporting an error {_position(gone[rank])} "
                f"(killed by a signal, or it exited on its own)")
        self._end(EXIT_AFTER_ANOTHER if self.quiet else 1, line, say=self._printer(gone))

    def _end_if_reported(self) -> None:
        report = self.folder.read_report()
        if report is not None:
            self._end(EXIT_STALLED, report.get("line"))

    def _end(self, status: int, line: str | None, *, say: bool = False) -> None:
        """End this process now with ``status``: children first, then the work_dir's lock.

        Whoever comes second waits here for the end.
        """
        self._ending.acquire()
        if say and line:
            _say(line)
        if line and self._log is not None:
            with contextlib.suppress(OSError), open(self._log, "a") as log:
                log.write(f"{time.strftime('%Y/%m/%d %H:%M:%S')} - flexgraph - ERROR - "
                          f"{line}\n")
        _kill_children()
        if self._release is not None:
            with contextlib.suppress(Exception):
                self._release()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def start_watchdog(settings: Any, context: Any, run_id: str, *,
                   release: Callable[[], None] | None = None) -> Watchdog | None:
    """Start this process's watchdog of run ``run_id`` (``None`` when ``stall_timeout=0``)."""
    folder = WatchFolder.of_run(settings.work_dir, run_id, settings.restart).make()
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                          str(folder.stacks.absolute() / "nccl_trace_rank_"))
    if not settings.watch.enabled:
        return None
    quiet = context.launch.handed_down.launcher_pid is not None
    return Watchdog(settings.watch, folder, rank=context.rank, world_size=context.world_size,
                    quiet=quiet, release=release).start()
