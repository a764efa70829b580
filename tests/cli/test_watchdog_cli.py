"""No run hangs in silence, and no rank outlives its run: ``--nproc-per-node 2`` (gloo).

Real runs of two ranks under flexgraph's launcher, each started in a session of its
own as a terminal or a scheduler starts it, and each found again afterwards by a token
in its processes' environment (:mod:`watch_helpers`): a rank blocked in a hook, a rank
stopped with SIGSTOP, a rank killed with SIGKILL, the launcher's process group sent
SIGTERM while a rank is blocked, every rank leaving with ``os._exit(0)``, a save
failing on one rank, a stall under ``--max-restarts``. Each test
measures the time from the stall to the last process gone, reads what was printed,
checks that no process of the run is left, and resumes the run with ``--resume auto``
to its end.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from flexgraph.cli.watchdog import EXIT_STALLED
from flexgraph.training.output import LOCK_FILE
from tests.cli.cli_helpers import final_state
from tests.cli.watch_helpers import (
    BLOCKING_LINE,
    ITERS,
    Run,
    assert_resumes,
    flexgraph_argv,
    stall_line,
    stalled_at,
    write_config,
)

pytestmark = pytest.mark.slow

LAUNCH = ("--nproc-per-node", "2")


def _bounds(stall: float, grace: float) -> tuple[str, ...]:
    return ("--cfg-options", f"env_cfg.stall_timeout={stall}",
            f"env_cfg.shutdown_timeout={grace}")


def _start(tmp_path: Path, how: str, *args: str, extra: str = "") -> tuple[Run, Path, float]:
    """Start the run, wait for the stall; ``(run, work_dir, when it stalled)``."""
    config = write_config(tmp_path / "cfg", how, extra=extra)
    work = tmp_path / "work"
    run = Run(flexgraph_argv(config, "--work-dir", str(work), *LAUNCH, *args), cwd=tmp_path)
    try:
        return run, work, stalled_at(work)
    except BaseException:
        run.wait(timeout=5)
        raise


def _resume(tmp_path: Path, work: Path, resumed_from: int | None = None) -> None:
    config = tmp_path / "cfg" / "cfg.py"
    again = Run(flexgraph_argv(config, "--work-dir", str(work), *LAUNCH, "--resume", "auto"),
                cwd=tmp_path, NO_STALL="1").wait()
    assert not again.left
    assert_resumes(again, work, resumed_from)


def test_a_rank_blocked_in_a_hook_stops_the_run_within_the_bound_with_every_stack(tmp_path):
    """The issue's "done when": a 20 s bound and a 10 s grace, every process gone within
    40 s of the block, one line naming rank 1 and its frame, every rank's stacks."""
    run, work, stalled = _start(tmp_path, "sleep", *_bounds(20, 10),
                                extra="train_dataloader = dict(num_workers=1)\n")
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 20 + 10 + 10, run.gone_at - stalled
    assert run.returncode == EXIT_STALLED, run.stderr[-3000:]
    line = stall_line(run.errors())
    assert 20 <= int(line[1]) <= 30 and int(line[2]) == BLOCKING_LINE
    stacks = tmp_path / line[3]
    assert stacks.parent.parent == work and sorted(p.name for p in stacks.iterdir()) == [
        "rank0.txt", "rank1.txt"]
    blocked = (stacks / "rank1.txt").read_text()
    assert f'watch_hooks.py", line {BLOCKING_LINE} in after_train_iter' in blocked
    assert "_engine_run_backward" in (stacks / "rank0.txt").read_text()  # waiting for rank 1
    assert "--resume auto" in run.stderr and "Traceback" not in run.stderr
    assert not (work / LOCK_FILE).exists()
    log = next(stacks.parent.glob("*.log")).read_text()
    assert line[0][len("error: "):] in log
    _resume(tmp_path, work, resumed_from=4)


def test_a_stopped_rank_is_named_as_not_responding_and_the_run_ends(tmp_path):
    run, work, stalled = _start(tmp_path, "stop", *_bounds(8, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 8 + 5 + 15, run.gone_at - stalled
    assert run.returncode == EXIT_STALLED, run.stderr[-3000:]
    [error] = run.errors()
    assert error.startswith("error: rank 1 is not responding: no heartbeat for "), error
    # where its last heartbeat caught it: the train step's start, or an iteration, or a save
    # within it, as the watchdog's thread happened to sample before the stop
    assert re.search(r"last seen (in step 'train'|at iteration [1-5](, saving a checkpoint)?) "
                     r"\(a stopped process, or one stuck outside Python", error), error
    assert "(stacks of the ranks that answered: " in error
    _resume(tmp_path, work, resumed_from=4)


def test_a_killed_rank_is_named_and_the_run_ends_at_once(tmp_path):
    run, work, stalled = _start(tmp_path, "kill", *_bounds(60, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 5 + 10, run.gone_at - stalled
    assert run.returncode == 1, run.stderr[-3000:]
    assert run.errors() == ["error: rank 1 was killed by SIGKILL in step 'train'"], run.stderr
    _resume(tmp_path, work, resumed_from=4)


def test_sigterm_to_the_launchers_process_group_ends_a_blocked_run_within_the_grace(tmp_path):
    """As ``timeout``, SLURM and Ctrl-C signal a run: the whole process
    group. The ranks cannot reach an iteration boundary; the grace period ends them."""
    run, work, _ = _start(tmp_path, "sleep", *_bounds(600, 5))
    sent = time.time()
    run.signal_group(signal.SIGTERM)
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - sent:.1f} s after the signal")
    assert run.gone_at - sent <= 5 + 10, run.gone_at - sent
    assert run.returncode == 128 + signal.SIGTERM, run.stderr[-3000:]
    assert run.errors() == [
        "error: stopped by SIGTERM before the ranks saved a checkpoint (ranks still running "
        "5 s later were killed: env_cfg.shutdown_timeout); --resume auto continues from the "
        "last complete one"], run.stderr
    assert not (work / LOCK_FILE).exists()
    _resume(tmp_path, work, resumed_from=4)


def test_ranks_that_all_exit_0_before_their_run_ends_are_a_failure_not_a_hang(tmp_path):
    run, work, stalled = _start(tmp_path, "exit0", *_bounds(60, 5))
    run.wait(timeout=120)
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the stall")
    assert run.gone_at - stalled <= 15, run.gone_at - stalled
    assert run.returncode == 1, run.stderr[-3000:]
    [error] = run.errors()
    assert error.startswith("error: rank ") and (
        " exited with status 0 before its run finished in step 'train'" in error), error
    _resume(tmp_path, work, resumed_from=4)


def test_under_max_restarts_a_stall_is_a_failure_and_the_group_resumes(tmp_path):
    run, work, _ = _start(tmp_path, "sleep", "--max-restarts", "1", *_bounds(10, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    assert run.returncode == 0, run.stderr[-3000:]
    warnings = [x for x in run.stderr.splitlines() if x.startswith("warning: ")]
    assert len(warnings) == 1, run.stderr[-3000:]
    assert warnings[0].startswith("warning: rank 1 made no progress for "), warnings
    assert warnings[0].endswith("; restarting the group (restart 1 of 1), which resumes from "
                                "the last complete checkpoint"), warnings
    assert "iter_4.pth: epoch 0, iter 4 (restart 1 of the group)" in run.stdout
    assert final_state(work)["meta"]["iter"] == ITERS


def test_a_save_failing_on_one_rank_is_the_failure_reported_and_the_others_end_at_once(
        tmp_path):
    """Rank 1's save raises (not a full device); rank 0, which would wait at the save's
    barrier, ends at once, and the launcher names rank 1's error, not a transport one."""
    run, work, stalled = _start(tmp_path, "fail_save", *_bounds(60, 5))
    run.wait()
    assert not run.left, f"left behind: {run.left}"
    print(f"every process gone {run.gone_at - stalled:.1f} s after the failure")
    assert run.gone_at - stalled <= 15, run.gone_at - stalled
    assert run.returncode == 1, run.stderr[-3000:]
    [error] = run.errors()
    assert error.startswith("error: rank 1 failed in step 'train' after "), error
    assert error.endswith("PermissionError: [Errno 13] Permission denied: 'iter_8'"), error
    assert "GLHF" not in run.stderr and "Connection" not in run.stderr
    _resume(tmp_path, work, resumed_from=4)
