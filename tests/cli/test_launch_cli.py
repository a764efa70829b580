"""``flexgraph run`` when things go wrong: before any step, on the ranks, and to a rank.

End to end, in real processes (two gloo ranks on CPU, launched by torch's
elastic agent): a misspelled function stops the run before anything runs; bad
input found on the ranks is reported once, as one process would report it; a
crash names its rank, step and iteration; and a rank killed with SIGKILL at a
random iteration is restarted by ``--max-restarts 1`` and the group resumes on
its own, ending with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import json
import random
import re
import textwrap
from pathlib import Path

import pytest

from tests.cli.cli_helpers import QUICKSTART, assert_same_training_state, final_state, flexgraph_run

pytestmark = pytest.mark.slow

ITERS = 23  # one epoch of digits, 32 a batch, on each of two ranks
CHECKPOINT_EVERY, LOG_EVERY = 4, 5

HOOKS = textwrap.dedent(
    '''
    """Test-only hooks: die or raise on one rank after a given iteration."""
    import os
    import signal

    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS


    @HOOKS.register_module(force=True)
    class KillOnce(Hook):
        """SIGKILL rank `rank` after iteration `at_iter` of the first attempt only."""

        def __init__(self, at_iter, rank):
            self.at_iter, self.rank = at_iter, rank

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            if first_attempt and runner.rank == self.rank and runner.iter + 1 == self.at_iter:
                os.kill(os.getpid(), signal.SIGKILL)


    @HOOKS.register_module(force=True)
    class WhoAmI(Hook):
        """Writes where this rank's process sits: its parent, its session, its launcher."""

        def before_train(self, runner):
            import json

            launcher = int(os.environ["FLEXGRAPH_LAUNCHER"])
            with open(os.path.join(runner.work_dir, f"who-rank{runner.rank}.json"), "w") as f:
                json.dump({"pid": os.getpid(), "parent": os.getppid(), "session": os.getsid(0),
                           "launcher": launcher}, f)


    @HOOKS.register_module(force=True)
    class CrashAt(Hook):
        def __init__(self, at_iter, rank):
            self.at_iter, self.rank = at_iter, rank

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.rank == self.rank and runner.iter + 1 == self.at_iter:
                raise RuntimeError(f"boom at iteration {self.at_iter}")
    '''
)

STEPS = textwrap.dedent(
    """
    import os


    def mark(cfg):
        open(os.path.join(os.path.dirname(cfg.filename), "a-step-ran"), "w").close()


    def freeze(model):
        return model
    """
)


def write_config(folder: Path, *, hooks: str = "", extra: str = "") -> Path:
    """One epoch of the quickstart, checkpoints every 4 iterations, a log line every 5."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "chaos_hooks.py").write_text(HOOKS)
    (folder / "mysteps.py").write_text(STEPS)
    (folder / "starred.py").write_text("from mysteps import *\n")
    config = folder / "cfg.py"
    config.write_text(
        textwrap.dedent(
            f"""
            _base_ = [{str(QUICKSTART)!r}]
            custom_imports = dict(imports=['digits', 'chaos_hooks'], allow_failed_imports=False)
            train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=2)
            default_hooks = dict(
                checkpoint=dict(type='CheckpointHook', interval={CHECKPOINT_EVERY},
                                by_epoch=False, max_keep_ckpts=2),
                logger=dict(type='LoggerHook', interval={LOG_EVERY}),
            )
            custom_hooks = [{hooks}]
            """
        )
        + extra
    )
    return config


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# fail fast ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "launch", "fragments"),
    [
        # a star import hides the name from the source check: found when imported
        ("starred:freez", [], ("step 'freeze'", "'starred' has no attribute 'freez'",
                               "did you mean 'freeze'")),
        ("mystep:freeze", ["--nproc-per-node", "2"], ("step 'freeze'", "no module named 'mystep'",
                                                      "did you mean 'mysteps'")),
        # the launcher imports what the source check cannot settle before it starts a rank
        ("starred:freez", ["--nproc-per-node", "2"], ("step 'freeze'",
                                                      "'starred' has no attribute 'freez'")),
    ],
    ids=["function", "module-before-launching", "function-before-launching"],
)
def test_a_misspelled_function_stops_the_run_before_any_step(tmp_path, ref, launch, fragments):
    steps = (
        "custom_steps = [\n"
        "    dict(name='mark', fn='mysteps:mark', requires='cfg', provides='marked',\n"
        "         before='setup_env'),\n"
        f"    dict(name='freeze', fn={ref!r}, updates='model', after='load_checkpoint'),\n"
        "]\n"
    )
    config = write_config(tmp_path / "cfg", extra=steps)
    result = flexgraph_run(str(config), "--work-dir", "never", *launch, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, (
        result.stderr)
    for fragment in fragments:
        assert fragment in result.stderr
    assert result.stdout == "", "no rank was started, no step ran"
    assert not (tmp_path / "cfg" / "a-step-ran").exists()
    assert not (tmp_path / "never").exists()


# errors on the ranks -----------------------------------------------------------------


def test_bad_input_found_on_the_ranks_is_reported_once_as_one_process_would(tmp_path):
    config = write_config(tmp_path / "cfg", extra="model = dict(type='NoSuchModel')\n")
    alone = flexgraph_run(str(config), "--work-dir", "alone", cwd=tmp_path)
    assert alone.returncode == 2, alone.stderr
    launched = flexgraph_run(str(config), "--work-dir", "ranks", "--nproc-per-node", "2",
                             "--max-restarts", "1", cwd=tmp_path)
    assert launched.returncode == 2, launched.stderr
    assert error_lines(launched.stderr) == error_lines(alone.stderr), launched.stderr
    assert "step 'build_model'" in launched.stderr and "NoSuchModel" in launched.stderr
    assert "Traceback" not in launched.stderr
    assert "restarting" not in launched.stderr, "bad input fails the same way every time"


def test_a_crashing_rank_is_named_with_its_step_and_iteration(tmp_path):
    config = write_config(tmp_path / "cfg", hooks="dict(type='CrashAt', at_iter=7, rank=1)")
    result = flexgraph_run(str(config), "--work-dir", "work", "--nproc-per-node", "2",
                           cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert error_lines(result.stderr) == [
        "error: rank 1 failed in step 'train' after 6 iterations: RuntimeError: boom at "
        "iteration 7"
    ], result.stderr
    assert "Traceback" not in result.stderr


# how ranks start -------------------------------------------------------------------


def test_ranks_are_children_of_the_launcher_in_sessions_of_their_own(tmp_path):
    config = write_config(tmp_path / "cfg", hooks="dict(type='WhoAmI')")
    done = flexgraph_run(str(config), "--work-dir", "work", "--nproc-per-node", "2",
                         cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    who = [json.loads((tmp_path / "work" / f"who-rank{r}.json").read_text()) for r in range(2)]
    assert [r["session"] for r in who] == [r["pid"] for r in who]
    assert who[0]["parent"] == who[1]["parent"] == who[0]["launcher"]
    assert final_state(tmp_path / "work")["meta"]["iter"] == ITERS


# chaos: SIGKILL one rank, --max-restarts 1 --------------------------------------------


def test_a_rank_killed_at_random_iterations_restarts_and_ends_with_the_same_weights(tmp_path):
    plain = write_config(tmp_path / "plain")
    done = flexgraph_run(str(plain), "--work-dir", "full", "--nproc-per-node", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = final_state(tmp_path / "full")
    assert expected["meta"]["iter"] == ITERS

    rng = random.Random(20260913)
    trials = [(rng.randrange(2, ITERS), rng.randrange(2)) for _ in range(5)]
    print(f"SIGKILL at (iteration, rank): {trials}")
    for trial, (kill_at, rank) in enumerate(trials):
        work = tmp_path / f"trial{trial}"
        config = write_config(work, hooks=f"dict(type='KillOnce', at_iter={kill_at}, rank={rank})")
        result = flexgraph_run(str(config), "--work-dir", str(work / "out"), "--nproc-per-node",
                               "2", "--max-restarts", "1", cwd=tmp_path)
        where = f"trial {trial}: kill rank {rank} at iteration {kill_at}\n{result.stderr[-3000:]}"
        assert result.returncode == 0, where

        # The launcher names the rank, the step, and the last iteration the rank recorded.
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warnings) == 1, where  # one death, one restart: the killer fired once
        assert warnings[0].startswith(f"warning: rank {rank} was killed by SIGKILL in step "
                                      "'train'"), where
        logged = LOG_EVERY * ((kill_at - 1) // LOG_EVERY)
        if logged:
            assert f"after at least {logged} iterations" in warnings[0], where
        assert "restarting the group (restart 1 of 1)" in warnings[0], where

        # The restarted group resumed from the last complete checkpoint before the kill.
        saved = CHECKPOINT_EVERY * ((kill_at - 1) // CHECKPOINT_EVERY)
        candidates = {saved, kill_at} if kill_at % CHECKPOINT_EVERY == 0 else {saved}
        resumed = re.search(r"Resumed from \S*iter_(\d+)\.pth: epoch 0, iter (\d+) "
                            r"\(restart 1 of the group\)", result.stdout)
        if resumed:
            assert int(resumed[1]) == int(resumed[2]) in candidates - {0}, where
        else:
            assert 0 in candidates, where
            assert "restart 1: no checkpoint in" in result.stdout, where

        assert_same_training_state(expected, final_state(work / "out"))
