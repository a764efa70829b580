"""``flexgraph run`` end to end, in real processes: single device and DDP (torchrun, gloo).

Interruptions are real crashes: a hook SIGKILLs its own process, once mid-epoch
and once in the middle of writing a checkpoint. Resumed runs must end
bit-identical to uninterrupted ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"

KILLER = textwrap.dedent(
    '''
    """Test-only hook: SIGKILL this process at an iteration, or halfway through a save."""
    import os
    import signal

    import torch
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS


    @HOOKS.register_module(force=True)
    class KillAt(Hook):
        def __init__(self, at_iter=-1, during_save=-1, rank=0):
            self.at_iter, self.during_save, self.rank = at_iter, during_save, rank
            self.saves = 0

        def _mine(self, runner):
            return runner.rank == self.rank

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if self._mine(runner) and runner.iter + 1 == self.at_iter:
                os.kill(os.getpid(), signal.SIGKILL)

        def before_save_checkpoint(self, runner, checkpoint):
            self.saves += 1
            if self._mine(runner) and self.saves == self.during_save:
                def half_then_die(obj, f, *args, **kwargs):
                    f.write(b"PK\\x03\\x04 half a checkpoint")
                    f.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                torch.save = half_then_die


    POINTS = [
        "before_run", "after_run", "before_train", "after_train", "before_train_epoch",
        "after_train_epoch", "before_train_iter", "after_train_iter", "before_val",
        "after_val", "before_val_epoch", "after_val_epoch", "before_val_iter",
        "after_val_iter", "before_save_checkpoint", "after_load_checkpoint",
    ]


    @HOOKS.register_module(force=True)
    class Record(Hook):
        """Appends every hook point it sees to work_dir/hooks-rank<R>.txt."""


    def _recorder(point):
        def record(self, runner, *args, **kwargs):
            os.makedirs(runner.work_dir, exist_ok=True)
            with open(os.path.join(runner.work_dir, f"hooks-rank{runner.rank}.txt"), "a") as f:
                f.write(point + "\\n")
        return record


    for _point in POINTS:
        setattr(Record, _point, _recorder(_point))
    '''
)


def write_config(folder: Path, record: bool = False, **killer) -> Path:
    """A 3-epoch quickstart that checkpoints every 20 iterations (mid-epoch)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "killer.py").write_text(KILLER)
    hooks = [f"dict(type='KillAt', **{killer!r})"] if killer else []
    hooks += ["dict(type='Record')"] if record else []
    hooks = "[" + ", ".join(hooks) + "]"
    config = folder / "cfg.py"
    config.write_text(
        textwrap.dedent(
            f"""
            _base_ = [{str(QUICKSTART)!r}]
            custom_imports = dict(imports=['digits', 'killer'], allow_failed_imports=False)
            train_cfg = dict(by_epoch=True, max_epochs=3, val_interval=3)
            default_hooks = dict(
                checkpoint=dict(type='CheckpointHook', interval=20, by_epoch=False,
                                max_keep_ckpts=3),
            )
            custom_hooks = {hooks}
            """
        )
    )
    return config


def flexgraph_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples")}
    return subprocess.run(
        [sys.executable, "-m", "flexgraph", "run", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def final_state(work_dir: Path) -> dict:
    pointer = Path((work_dir / "last_checkpoint").read_text().strip())
    return torch.load(pointer, weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    assert a["meta"]["iter"] == b["meta"]["iter"]
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    for pid, state in a["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(
                b["optimizer"]["state"][pid][key])), (pid, key)


@pytest.mark.parametrize("nproc", [1, 2], ids=["single", "ddp"])
def test_a_run_killed_mid_epoch_resumes_bit_identical(tmp_path, nproc):
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    plain = write_config(tmp_path / "plain")
    done = flexgraph_run(str(plain), "--work-dir", "full", *launch, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    # 45 (single) or 23 (two ranks) iterations per epoch: iteration 50 / 30 is mid-epoch 2
    kill_at = 50 if nproc == 1 else 30
    killing = write_config(tmp_path / "killing", at_iter=kill_at, rank=nproc - 1)
    killed = flexgraph_run(str(killing), "--work-dir", "cut", *launch, cwd=tmp_path)
    assert killed.returncode != 0
    saved = final_state(tmp_path / "cut")["meta"]
    assert saved["iter"] == 40 if nproc == 1 else 20
    assert saved["batch_idx"] > 0, "the checkpoint must be mid-epoch"

    resumed = flexgraph_run(
        str(plain), "--work-dir", "cut", "--resume", "auto", *launch, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_training_state(final_state(tmp_path / "full"), final_state(tmp_path / "cut"))


def test_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    killing = write_config(tmp_path / "killing", during_save=2)
    killed = flexgraph_run(str(killing), "--work-dir", "work", cwd=tmp_path)
    assert killed.returncode != 0
    work = tmp_path / "work"
    state = final_state(work)  # the pointer still names the first save, and it loads
    assert state["meta"]["iter"] == 20
    assert [p.name for p in work.glob("iter_*.pth")] == ["iter_20.pth"]
    assert [p.name for p in work.glob(".tmp-*")] == [".tmp-iter_40.pth"], "the torn write"

    plain = write_config(tmp_path / "plain")
    resumed = flexgraph_run(str(plain), "--work-dir", "work", "--resume", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert final_state(work)["meta"]["iter"] == 135
    assert not list(work.glob(".tmp-*")), "the next save sweeps torn writes away"


def test_quickstart_with_two_processes_writes_metrics_once(tmp_path):
    config = write_config(tmp_path / "cfg")
    done = flexgraph_run(str(config), "--work-dir", "ddp", "--nproc-per-node", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "strategy ddp" in done.stdout
    lines = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x.get("mode", "train") == "train"]
    assert [x["iter"] for x in train] == sorted({x["iter"] for x in train}), "one writer"
    assert max(x["iter"] for x in train) == 3 * 23
    # rank 0 alone writes the run's log, config and plan: one folder, three files
    (run_dir,) = [p for p in (tmp_path / "ddp").iterdir() if p.is_dir() and p.name[0].isdigit()]
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [f"{run_dir.name}.log", "config.py", "plan.json"])
    assert '"strategy": "ddp"' in (run_dir / "plan.json").read_text()


def hook_trace(path: Path) -> list[str]:
    """The hook points in order; each run of train (or val) iterations becomes one entry.

    The iteration count differs between one process and two; the structure must not.
    """
    trace: list[str] = []
    for point in path.read_text().split():
        if point.endswith("_iter"):
            point = point.split("_", 1)[1] + "s*"  # before_train_iter -> train_iters*
        if not (point.endswith("*") and trace and trace[-1] == point):
            trace.append(point)
    return trace


def test_every_hook_point_fires_in_the_same_order_under_single_and_ddp(tmp_path):
    config = write_config(tmp_path / "cfg", record=True)
    traces = {}
    per_epoch = ["default_hooks.checkpoint.by_epoch=True", "default_hooks.checkpoint.interval=1"]
    for name, launch in (("single", []), ("ddp", ["--nproc-per-node", "2"])):
        for run in ("first", "resumed"):
            extra = ["--resume", "auto"] if run == "resumed" else []
            epochs = ["train_cfg.max_epochs=4"] if run == "resumed" else []
            done = flexgraph_run(
                str(config), "--work-dir", name, *launch, *extra,
                "--cfg-options", *per_epoch, *epochs, cwd=tmp_path,
            )
            assert done.returncode == 0, done.stderr[-3000:]
    for name, ranks in (("single", [0]), ("ddp", [0, 1])):
        for rank in ranks:
            traces[name, rank] = hook_trace(tmp_path / name / f"hooks-rank{rank}.txt")
    assert traces["single", 0] == traces["ddp", 0] == traces["ddp", 1]
    trace = traces["single", 0]
    assert trace[:3] == ["before_run", "before_train", "before_train_epoch"]
    assert "before_save_checkpoint" in trace and "after_load_checkpoint" in trace
    assert trace.count("before_run") == trace.count("after_run") == 2
    assert trace.index("after_load_checkpoint") > trace.index("after_run")  # the resumed run


def test_a_bad_config_exits_2_before_anything_is_written(tmp_path):
    config = tmp_path / "bad.py"
    config.write_text("model = dict(type='NoSuchModel')\ntrain_cfg = dict(max_epochs=1\n")
    result = flexgraph_run(str(config), "--work-dir", "never", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "bad.py" in result.stderr
    assert not (tmp_path / "never").exists()


def test_single_strategy_refuses_two_processes(tmp_path):
    result = flexgraph_run(
        str(QUICKSTART), "--strategy", "single", "--nproc-per-node", "2", cwd=tmp_path
    )
    assert result.returncode == 2
    assert "use --strategy ddp" in result.stderr


def test_entry_val_evaluates_a_checkpoint_to_the_accuracy_training_reported(tmp_path):
    config = write_config(tmp_path / "cfg")
    trained = flexgraph_run(str(config), "--work-dir", "work", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    reported = trained.stdout.split("'val/accuracy/top1': ")[1].split("}")[0]
    last = (tmp_path / "work" / "last_checkpoint").read_text().strip()
    evaluated = flexgraph_run(
        str(config), "--entry", "val", "--load-from", last, "--work-dir", "eval", cwd=tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "resume" not in evaluated.stdout.split("\n")[0], "val plans no optimizer or resume"
    assert f"val_result: {{'accuracy/top1': {reported}}}" in evaluated.stdout
