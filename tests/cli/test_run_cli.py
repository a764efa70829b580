"""``flexgraph run`` end to end, in real processes: single device and DDP (torchrun, gloo).

Interruptions are real crashes: a hook SIGKILLs its own process, once mid-epoch
and once in the middle of writing a checkpoint. Resumed runs must end
bit-identical to uninterrupted ones. One uninterrupted run per process count
serves every test that reads one (each launch costs seconds of start-up).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.cli_helpers import (
    QUICKSTART,
    assert_same_training_state,
    final_state,
    flexgraph_run,
    hook_trace,
    write_config,
)

pytestmark = pytest.mark.slow


def _launch(nproc: int) -> list[str]:
    return ["--nproc-per-node", str(nproc)] if nproc > 1 else []


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """``plain_run(nproc)``: ``write_config``'s plain run (3 epochs) in ``<folder>/full``,
    made once per process count for every test that needs one: ``(folder, result)``.
    One process runs with ``--estimate``, two with ``--strategy auto`` (which must
    choose ddp, the default there). Either estimates before training, changing nothing
    in it, and leaves ``memory.json`` in the work_dir."""
    made: dict[int, tuple[Path, subprocess.CompletedProcess]] = {}

    def run(nproc: int) -> tuple[Path, subprocess.CompletedProcess]:
        if nproc not in made:
            root = tmp_path_factory.mktemp(f"plain{nproc}")
            plain = write_config(root / "plain")
            estimated = ["--estimate"] if nproc == 1 else ["--strategy", "auto"]
            done = flexgraph_run(str(plain), "--work-dir", "full", *estimated,
                                 *_launch(nproc), cwd=root)
            assert done.returncode == 0, done.stderr[-3000:]
            made[nproc] = root, done
        return made[nproc]

    return run


@pytest.mark.parametrize("nproc", [1, 2], ids=["single", "ddp"])
def test_a_run_killed_mid_epoch_resumes_bit_identical(tmp_path, plain_run, nproc):
    launch = _launch(nproc)
    root, _ = plain_run(nproc)
    plain = root / "plain" / "cfg.py"

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
    assert_same_training_state(final_state(root / "full"), final_state(tmp_path / "cut"))


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


def test_quickstart_with_two_processes_writes_metrics_once(plain_run):
    root, done = plain_run(2)
    work = root / "full"
    assert "strategy ddp" in done.stdout
    lines = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x.get("mode", "train") == "train"]
    assert [x["iter"] for x in train] == sorted({x["iter"] for x in train}), "one writer"
    assert max(x["iter"] for x in train) == 3 * 23
    # rank 0 alone writes the run's log, config, plan and visualizer output: one folder,
    # its files, one TensorBoard events file and the LocalVisBackend's two scalar files
    # (the quickstart's backends)
    (run_dir,) = [p for p in work.iterdir() if p.is_dir() and p.name[0].isdigit()]
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [f"{run_dir.name}.log", "config.py", "plan.json", "memory.json", "vis_data",
         "timings.txt", "plan.html"])
    vis_data = {p.name for p in (run_dir / "vis_data").iterdir()}
    events = {name for name in vis_data if name.startswith("events.out.tfevents.")}
    assert len(events) == 1 and vis_data - events == {f"{run_dir.name}.json", "scalars.json"}
    assert '"strategy": "ddp"' in (run_dir / "plan.json").read_text()


@pytest.mark.parametrize("nproc, strategy", [(1, "single"), (2, "ddp")], ids=["single", "ddp"])
def test_an_estimated_run_records_each_steps_peak_next_to_the_estimate(plain_run, nproc,
                                                                        strategy):
    root, done = plain_run(nproc)
    (run_dir,) = [p for p in (root / "full").iterdir() if p.is_dir() and p.name[0].isdigit()]
    memory = json.loads((run_dir / "memory.json").read_text())
    order = [s["name"] for s in json.loads((run_dir / "plan.json").read_text())["steps"]]
    estimate, measured, steps = memory["estimate"], memory["measured"], memory["steps"]
    assert (estimate["candidate"], estimate["world_size"]) == (strategy, nproc)
    assert estimate["peak_bytes"] > 0 and estimate["step"] == order[-1]
    assert [s["step"] for s in steps] == order
    # the training step carries the estimate; the peak RSS never falls from step to step
    assert [s["estimate_bytes"] for s in steps] == [None] * (len(order) - 1) + [
        estimate["peak_bytes"]]
    peaks = [s["peak_rss_bytes"] for s in steps]
    assert peaks == sorted(peaks) and measured["peak_bytes"] == peaks[-1]
    # on CPU the only measure is the rank's RSS: labelled so, and given no ratio
    assert measured["source"] == "peak RSS of rank 0" and measured["ratio"] is None
    assert "memory: estimated" in done.stdout and "peak RSS of rank 0" in done.stdout
    if nproc == 2:  # --strategy auto: its choice and reason are in the run's log
        log = (run_dir / f"{run_dir.name}.log").read_text()
        assert "strategy auto chose ddp" in log and "fits" in log


def _many_process_strategies() -> list[str]:
    """Every registered strategy that runs on a process group, by its own name."""
    from flexgraph.core.strategy import get_strategy, known_strategies

    built = [get_strategy(name) for name in known_strategies()]
    return sorted({s.name for s in built if s.world_size == "many"})


def _hook_traces(root: Path, name: str, launch: list[str]) -> list[list[str]]:
    """Hook points a first run and a resumed run fire, per rank, under one strategy."""
    config = write_config(root / "cfg", record=True)
    per_epoch = ["default_hooks.checkpoint.by_epoch=True", "default_hooks.checkpoint.interval=1"]
    for run in ("first", "resumed"):
        extra = ["--resume", "auto"] if run == "resumed" else []
        epochs = ["train_cfg.max_epochs=4"] if run == "resumed" else []
        done = flexgraph_run(
            str(config), "--work-dir", name, *launch, *extra,
            "--cfg-options", *per_epoch, *epochs, cwd=root,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    ranks = sorted((root / name).glob("hooks-rank*.txt"))
    return [hook_trace(path) for path in ranks]


@pytest.fixture(scope="module")
def single_trace(tmp_path_factory):
    [trace] = _hook_traces(tmp_path_factory.mktemp("single"), "single", [])
    assert trace[:3] == ["before_run", "before_train", "before_train_epoch"]
    assert "before_save_checkpoint" in trace and "after_load_checkpoint" in trace
    assert trace.count("before_run") == trace.count("after_run") == 2
    assert trace.index("after_load_checkpoint") > trace.index("after_run")  # the resumed run
    return trace


@pytest.mark.parametrize("strategy", _many_process_strategies())
def test_every_hook_point_fires_in_the_same_order_under_every_strategy(
        tmp_path, single_trace, strategy):
    launch = ["--nproc-per-node", "2", "--strategy", strategy]
    traces = _hook_traces(tmp_path, strategy, launch)
    assert len(traces) == 2
    for rank, trace in enumerate(traces):
        assert trace == single_trace, (strategy, rank)


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


def test_entry_val_evaluates_a_checkpoint_to_the_accuracy_training_reported(
        tmp_path, plain_run):
    root, trained = plain_run(1)
    config = root / "plain" / "cfg.py"
    reported = trained.stdout.split("'val/accuracy/top1': ")[1].split("}")[0]
    last = (root / "full" / "last_checkpoint").read_text().strip()
    evaluated = flexgraph_run(
        str(config), "--entry", "val", "--load-from", last, "--work-dir", "eval", cwd=tmp_path
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "resume" not in evaluated.stdout.split("\n")[0], "val plans no optimizer or resume"
    assert f"val_result: {{'accuracy/top1': {reported}}}" in evaluated.stdout


def test_a_launched_rank_refuses_to_run_a_plan_other_than_its_launchers(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1",
           "FLEXGRAPH_PLAN_DIGEST": "0123456789abcdef"}
    done = subprocess.run([sys.executable, "-m", "flexgraph", "run", str(QUICKSTART),
                           "--dry-run"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "rank 0 planned differently from its launcher" in done.stderr
