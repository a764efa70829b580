"""Shared pieces of the watchdog's end-to-end tests: a hook that stalls one rank, a run whose
every process is found by a token in its environment, and the clock from stall to silence.

A run's processes (launcher, ranks, their dataloader workers, SLURM's tasks)
all inherit the environment the test gives the first one, so a token in it finds each of
them in ``/proc`` without knowing how they were started; a zombie's environment reads
empty, so it counts as gone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from tests.cli.cli_helpers import QUICKSTART, ROOT, final_state

ITERS = 23  # one epoch of digits, 32 a batch, on each of two ranks
TOKEN_VAR = "FLEXGRAPH_TEST_RUN_TOKEN"

HOOKS = textwrap.dedent(
    '''
    """Test-only hook: one rank stalls, stops, dies or fails after an iteration."""
    import os
    import signal
    import time

    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS


    @HOOKS.register_module(force=True)
    class Stall(Hook):
        """``how`` on rank ``rank`` once ``at_iter`` iterations are done (when armed):
        sleep (a blocked hook), stop (SIGSTOP), kill (SIGKILL), exit0 (every rank
        calls os._exit(0)), or fail_save (the next save raises on that rank)."""

        def __init__(self, at_iter=5, rank=1, how="sleep"):
            self.at_iter, self.rank, self.how = at_iter, rank, how

        def _mark(self, runner):
            with open(os.path.join(runner.work_dir, "stalled"), "w") as f:
                f.write(repr(time.time()))

        def _armed(self):
            """Not in a resumed run (NO_STALL), nor in a restarted group."""
            restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
            return not (os.environ.get("NO_STALL") or restarted)

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter + 1 != self.at_iter or not self._armed():
                return
            if self.how == "exit0":
                self._mark(runner)
                os._exit(0)
            if runner.rank != self.rank or self.how == "fail_save":
                return
            self._mark(runner)
            if self.how == "sleep":
                time.sleep(3600)  # the blocking frame
            elif self.how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)

        def before_train(self, runner):
            """What the process group was given, for the CUDA test."""
            import json

            import torch.distributed as dist

            names = ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                     "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
            seen = {name: os.environ.get(name) for name in names}
            seen["backend"] = dist.get_backend() if dist.is_initialized() else None
            with open(os.path.join(runner.work_dir, f"group-rank{runner.rank}.json"), "w") as f:
                json.dump(seen, f)

        def before_save_checkpoint(self, runner, checkpoint):
            if (self.how == "fail_save" and runner.rank == self.rank
                    and runner.iter + 1 >= self.at_iter and self._armed()):
                self._mark(runner)
                raise PermissionError(f"[Errno 13] Permission denied: 'iter_{runner.iter + 1}'")
    '''
)
BLOCKING_LINE = next(n for n, line in enumerate(HOOKS.splitlines(), 1)
                     if "# the blocking frame" in line)
"""The line of ``watch_hooks.py`` a rank blocked in a hook sleeps on."""


def write_config(folder: Path, how: str, *, rank: int = 1, extra: str = "") -> Path:
    """One epoch of the quickstart, checkpoints every 4 iterations, ``Stall(how)`` on ``rank``
    after iteration 5."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "watch_hooks.py").write_text(HOOKS)
    config = folder / "cfg.py"
    config.write_text(textwrap.dedent(
        f"""
        _base_ = [{str(QUICKSTART)!r}]
        custom_imports = dict(imports=['digits', 'watch_hooks'], allow_failed_imports=False)
        train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=2)
        default_hooks = dict(
            checkpoint=dict(type='CheckpointHook', interval=4, by_epoch=False,
                            max_keep_ckpts=2),
            logger=dict(type='LoggerHook', interval=5))
        custom_hooks = [dict(type='Stall', at_iter=5, rank={rank}, how={how!r})]
        """) + extra)
    return config


def run_env(token: str, **extra: str) -> dict[str, str]:
    """The environment of a run marked with ``token``."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "examples"),
            "OMP_NUM_THREADS": "1", TOKEN_VAR: token, **extra}


def processes_of(token: str) -> list[int]:
    """The processes whose environment holds ``token`` (zombies read as none)."""
    marker = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def end_all(token: str) -> None:
    """SIGKILL whatever of a run is left (a failed test leaves no process behind)."""
    for pid in processes_of(token):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Run:
    """A run started in a session of its own (a terminal's or ``timeout``'s process group),
    its output, and when its last process was gone."""

    def __init__(self, argv: Sequence[str], cwd: Path, **env: str) -> None:
        self.token = uuid.uuid4().hex
        self.cwd = cwd
        self.process = subprocess.Popen(list(argv), cwd=cwd, env=run_env(self.token, **env),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)
        self.gone_at: float | None = None
        self.left: list[int] = []

    def wait(self, timeout: float = 300) -> Run:
        """Wait for the first process, then up to 30 s more for every other one."""
        try:
            self.stdout, self.stderr = self.process.communicate(timeout=timeout)
        finally:
            deadline = time.time() + 30
            while processes_of(self.token) and time.time() < deadline:
                time.sleep(0.1)
            self.gone_at = time.time()
            self.left = processes_of(self.token)
            end_all(self.token)
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.communicate()
        self.returncode = self.process.returncode
        return self

    def signal_group(self, signum: int) -> None:
        """``signum`` to the run's whole process group, as ``timeout``, SLURM, Ctrl-C do."""
        os.killpg(self.process.pid, signum)

    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error: ")]


def flexgraph_argv(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "flexgraph", "run", str(config), *args]


def stalled_at(work: Path, timeout: float = 240) -> float:
    """When the hook stalled its rank (waits for it to happen)."""
    marker = work / "stalled"
    deadline = time.time() + timeout
    while not marker.exists():
        assert time.time() < deadline, f"no rank stalled in {work}"
        time.sleep(0.1)
    time.sleep(0.05)
    return float(marker.read_text() or time.time())


STALL_LINE = (r"rank {rank} made no progress for (\d+) s at iteration 5, in "
              r"watch_hooks\.py:(\d+) after_train_iter \(stacks of every rank: (\S+)/\)")
"""The watchdog's line about a rank blocked in the hook (groups: seconds, line, stacks)."""


def stall_line(errors: list[str], rank: int = 1) -> re.Match[str]:
    """The watchdog's one line about rank ``rank`` blocked in the hook."""
    assert len(errors) == 1, errors
    match = re.fullmatch("error: " + STALL_LINE.format(rank=rank), errors[0])
    assert match, errors[0]
    return match


def assert_resumes(run: Run, work: Path, resumed_from: int | None = None) -> None:
    """The same command with ``--resume auto`` (and no stall) trains to the end from the
    last complete checkpoint."""
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Resumed from" in run.stdout, run.stdout[-3000:]
    if resumed_from is not None:
        assert f"iter_{resumed_from}.pth: epoch 0, iter {resumed_from}" in run.stdout
    assert final_state(work)["meta"]["iter"] == ITERS
