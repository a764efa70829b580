"""No run hangs in silence under ``srun -n2``, one task per rank and no launcher.

The same cases as ``test_watchdog_cli.py``, on a real SLURM (``slurm_cluster.py``):
there the ranks' watchdogs alone find the stall, say it, and end every task; SLURM
ends the step of a task that was killed only once every task ended. Plus the first
failure named: a save that fails on rank 1 for another reason than a full device is
what rank 0 reports, not the transport error its collective got.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from flexgraph.cli.watchdog import EXIT_STALLED
from flexgraph.training.output import LOCK_FILE
from tests.cli.watch_helpers import (
    BLOCKING_LINE,
    Run,
    assert_resumes,
    stall_line,
    stalled_at,
    write_config,
)

pytestmark = pytest.mark.slow


def _srun(slurm, config: Path, work: Path, *args: str, cwd: Path, **env: str) -> Run:
    argv = ["srun", "-n2", sys.executable, "-m", "flexgraph", "run", str(config),
            "--work-dir", str(work), *args]
    cluster = slurm.env()
    return Run(argv, cwd=cwd, SLURM_CONF=cluster["SLURM_CONF"], PATH=cluster["PATH"], **env)


def _bounds(stall: float, grace: float) -> tuple[str, ...]:
    return ("--cfg-options", f"env_cfg.stall_timeout={stall}",
            f"env_cfg.shutdown_timeout={grace}")


def _start(slurm, tmp_path: Path, how: str, *args: str) -> tuple[Run, Path, float]:
    config = write_config(tmp_path / "cfg", how)
    work = tmp_path / "work"
    run = _srun(slurm, config, work, *args, cwd=tmp_path)
    try:
        return run, work, stalled_at(work)
    except BaseException:
        run.wait(timeout=5)
        raise


def _resume(slurm, tmp_path: Path, work: Path, resumed_from: int) -> None:
    again = _srun(slurm, tmp_path / "cfg" / "cfg.py", work, "--resume", "auto", cwd=tmp_path,
                  NO_STALL="1").wait()
    assert not again.left
    assert_resumes(again, work, resumed_from)


def test_a_rank_blocked_in_a_hook_stops_every_task_within_the_bound(slurm, tmp_path):
    """The issue's "done when" under ``srun -n2``: 20 s bound, 10 s grace, 40 s in all."""
    run, work, stalled = _start(slurm, tmp_path, "sleep", *_bounds(20, 10))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 20 + 10 + 10, run.gone_at - stalled
    assert run.returncode == EXIT_STALLED, run.stderr[-3000:]
    line = stall_line(run.errors())  # said once, by the rank that reported
    assert int(line[2]) == BLOCKING_LINE
    stacks = tmp_path / line[3]
    assert stacks.parent.parent == work
    assert f'watch_hooks.py", line {BLOCKING_LINE} in after_train_iter' in (
        stacks / "rank1.txt").read_text()
    assert (stacks / "rank0.txt").exists()
    assert not (work / LOCK_FILE).exists(), "rank 0 released the work_dir as it ended"
    _resume(slurm, tmp_path, work, resumed_from=4)


def test_a_stopped_task_is_continued_and_ends_with_the_others(slurm, tmp_path):
    run, work, stalled = _start(slurm, tmp_path, "stop", *_bounds(8, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 8 + 5 + 15, run.gone_at - stalled
    assert run.returncode == EXIT_STALLED, run.stderr[-3000:]
    errors = run.errors()
    assert len(errors) == 1, run.stderr[-3000:] + run.stdout[-3000:]
    [error] = errors
    assert error.startswith("error: rank 1 is not responding: no heartbeat for "), error
    _resume(slurm, tmp_path, work, resumed_from=4)


def test_a_killed_task_is_named_by_the_others(slurm, tmp_path):
    run, work, stalled = _start(slurm, tmp_path, "kill", *_bounds(60, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 15, run.gone_at - stalled
    [error] = run.errors()
    assert error.startswith("error: rank 1 ended without reporting an error "), error
    assert error.endswith("(killed by a signal, or it exited on its own)"), error
    assert "GLHF" not in run.stderr and "Connection" not in run.stderr
    _resume(slurm, tmp_path, work, resumed_from=4)


def test_sigterm_to_sruns_process_group_leaves_no_task_behind(slurm, tmp_path):
    """As ``timeout`` or Ctrl-C signal an ``srun``: SLURM cancels the step and kills what
    did not stop (``KillWait``); a stale lock of the killed rank 0 is taken over."""
    run, work, _ = _start(slurm, tmp_path, "sleep", *_bounds(600, 5))
    sent = time.time()
    run.signal_group(signal.SIGTERM)
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - sent:.1f} s after the signal")
    assert run.gone_at - sent <= 5 + 10, run.gone_at - sent
    assert run.returncode != 0
    _resume(slurm, tmp_path, work, resumed_from=4)


def test_a_save_failing_on_one_rank_is_the_failure_the_others_report(slurm, tmp_path):
    run, work, stalled = _start(slurm, tmp_path, "fail_save", *_bounds(60, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 15, run.gone_at - stalled
    assert run.returncode == 1, run.stderr[-3000:]
    denied = "PermissionError: [Errno 13] Permission denied: 'iter_8'"
    errors = run.errors()
    assert len(errors) == 2 and all(e.endswith(denied) for e in errors), errors
    assert errors[0].startswith("error: step 'train' (base) failed: ") or errors[1].startswith(
        "error: step 'train' (base) failed: "), errors  # rank 1's own line
    assert any(e.startswith("error: rank 1 failed in step 'train' after ")
               for e in errors), errors  # rank 0's: the first failure, not its own
    assert "GLHF" not in run.stderr and "Connection" not in run.stderr
    _resume(slurm, tmp_path, work, resumed_from=4)
