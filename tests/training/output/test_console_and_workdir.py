"""A run's console shows flexgraph's lines; its work_dir keeps the log, config and plan.

End to end through ``flexgraph run`` on a BaseModel config whose ``init_cfg`` and
``paramwise_cfg`` make MMEngine log a line per parameter (the chatter that
fills a console with hundreds of lines for a ViT).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mmengine.config import Config
from mmengine.logging import print_log

from flexgraph.cli.main import main
from flexgraph.training.config import read_settings
from flexgraph.training.output import open_run_record
from tests.training.training_helpers import REPO

PARAMETERS = {"body.weight": "[16, 8]", "body.bias": "[16]", "head.weight": "[3, 16]",
              "head.bias": "[3]"}

CONFIG = textwrap.dedent("""
    custom_imports = dict(imports=['tests.training.mmengine_parts'], allow_failed_imports=False)
    model = dict(type='MigrationNet',
                 init_cfg=dict(type='Normal', layer='Linear', std=0.05, bias=0.0))
    train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='PairsDataset'),
                            sampler=dict(type='DefaultSampler', shuffle=True))
    optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, weight_decay=1e-4),
                         paramwise_cfg=dict(bias_decay_mult=0.0))
    train_cfg = dict(by_epoch=True, max_epochs=2)
    default_hooks = dict(  # MMEngine's default hooks, as its default runtime lists them
        runtime_info=dict(type='RuntimeInfoHook'),
        timer=dict(type='IterTimerHook'),
        sampler_seed=dict(type='DistSamplerSeedHook'),
        logger=dict(type='LoggerHook', interval=3),
        param_scheduler=dict(type='ParamSchedulerHook'),
        checkpoint=dict(type='CheckpointHook', interval=1))
    custom_hooks = [dict(type='EmptyCacheHook', after_iter=True)]
    randomness = dict(seed=0)
""")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """``python -X importtime -m flexgraph run cfg.py``: its console, work_dir and imports."""
    root = tmp_path_factory.mktemp("run")
    (root / "cfg.py").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flexgraph", "run", "cfg.py",
         "--work-dir", "work"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    imports = [line.rpartition("|")[2].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:")]
    stderr = "\n".join(line for line in done.stderr.splitlines()
                       if not line.startswith("import time:"))
    return {"root": root, "console": done.stdout + stderr, "work": root / "work",
            "imports": imports}


@pytest.mark.slow
def test_a_single_device_run_imports_neither_deepspeed_nor_mmengine_runner(run):
    """``import mmengine.runner`` imports every strategy, DeepSpeed too where installed;
    TensorBoard's writer only comes with a ``TensorboardVisBackend``, as in MMEngine."""
    imported = set(run["imports"])
    parsed = {"torch", "mmengine.model", "flexgraph.training.loop._train_loop"}
    assert parsed <= imported  # parsed right
    unwanted = sorted(name for name in imported
                      if name.split(".")[0] in ("deepspeed", "tensorboard")
                      or name.startswith(("mmengine.runner", "torch.utils.tensorboard")))
    assert unwanted == []
    assert "accelerator" not in run["console"]  # DeepSpeed's warning on import


def _run_dir(work: Path) -> Path:
    (run_dir,) = [p for p in work.iterdir() if p.is_dir()]
    return run_dir


@pytest.mark.slow
def test_mmengine_chatter_goes_to_the_log_file_not_the_console(run):
    run_dir = _run_dir(run["work"])
    log = (run_dir / f"{run_dir.name}.log").read_text()
    console = run["console"]
    for name, shape in PARAMETERS.items():  # init_weights' report, one entry per parameter
        assert f"{name} - torch.Size({shape})" in log, name
        assert f"{name} - torch.Size" not in console, name
    assert "paramwise_options -- body.bias:weight_decay=0.0" in log
    assert "paramwise_options" not in console
    assert "NormalInit" in log and "NormalInit" not in console
    # flexgraph's own lines: on the console, and in the log file too
    for line in ("flexgraph: 13 steps", "Epoch(train) [2/2][6/6]"):
        assert line in console and line in log, line
    assert "step timings" in console and "Saved checkpoint" in console


@pytest.mark.slow
def test_work_dir_holds_log_config_plan_metrics_and_checkpoints(run, capsys):
    work, run_dir = run["work"], _run_dir(run["work"])
    assert sorted(p.name for p in work.iterdir()) == sorted(
        [run_dir.name, "epoch_1.pth", "epoch_2.pth", "last_checkpoint", "metrics.jsonl"])
    # vis_data: the scalar files MMEngine's default visualizer (a LocalVisBackend) writes,
    # written without building it; config.py stands for its config
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(
        [f"{run_dir.name}.log", "config.py", "plan.json", "vis_data", "timings.txt",
         "plan.html"])
    assert sorted(p.name for p in (run_dir / "vis_data").iterdir()) == [
        f"{run_dir.name}.json", "scalars.json"]
    records = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records] == list(range(1, 13))  # every iteration, raw
    scalars = (run_dir / "vis_data" / "scalars.json").read_text().splitlines()
    assert (run_dir / "vis_data" / f"{run_dir.name}.json").read_text().splitlines() == scalars
    assert [json.loads(x)["step"] for x in scalars] == [3, 6, 9, 12]  # a line every 3
    assert (run_dir / "plan.json").read_text() == _plan_json(run["root"] / "cfg.py", capsys)


def _plan_json(config: Path, capsys) -> str:
    """What ``flexgraph plan CONFIG --format json`` prints (in this process: no torch import)."""
    capsys.readouterr()
    assert main(["plan", str(config), "--format", "json"]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_the_written_config_runs_again_with_the_same_plan(run, tmp_path, capsys):
    run_dir = _run_dir(run["work"])
    config = run_dir / "config.py"
    assert Config.fromfile(str(config)).model.init_cfg.std == 0.05  # resolved, not a copy
    assert _plan_json(config, capsys) == (run_dir / "plan.json").read_text()
    assert main(["run", str(config), "--work-dir", str(tmp_path / "again"),
                 "--cfg-options", "train_cfg.max_epochs=1"]) == 0
    again = _run_dir(tmp_path / "again")
    assert (again / "plan.json").read_text() == (run_dir / "plan.json").read_text()


def test_console_keeps_warnings_and_own_lines_and_drops_mmengine_info(tmp_path, capsys):
    cfg = Config(dict(work_dir=str(tmp_path / "work")))
    record = open_run_record(cfg, read_settings(cfg), "{}", rank=0)
    try:
        print_log("chatter from mmengine", logger="current", level=logging.INFO)
        print_log("mmengine warns", logger="current", level=logging.WARNING)
        record.logger.info("flexgraph says")
        record.note("for the file only")
    finally:
        record.close()
    out = capsys.readouterr().out
    assert "mmengine warns" in out and "flexgraph says" in out
    assert "chatter" not in out and "for the file only" not in out
    log = (record.run_dir / f"{record.timestamp}.log").read_text()
    for line in ("chatter from mmengine", "mmengine warns", "flexgraph says", "for the file only"):
        assert line in log, line


def test_other_ranks_write_nothing_and_show_only_errors(tmp_path, capsys):
    cfg = Config(dict(work_dir=str(tmp_path / "work")))
    record = open_run_record(cfg, read_settings(cfg), "{}", rank=1)
    try:
        record.logger.warning("a warning")
        record.logger.error("an error")
    finally:
        record.close()
    out = capsys.readouterr().out
    assert "an error" in out and "a warning" not in out
    assert not (tmp_path / "work").exists()


def test_a_log_file_on_a_full_device_never_buries_the_runs_own_error(small_device, capsys):
    """The run fails with its own line (a checkpoint that did not fit); the log file
    that cannot grow neither prints logging's traceback per line nor fails on close."""
    cfg = Config(dict(work_dir=str(small_device / "work")))
    record = open_run_record(cfg, read_settings(cfg), "{}", rank=0)
    with contextlib.suppress(OSError):  # ENOSPC: the device is full now
        (small_device / "filler").write_bytes(b"\0" * 400_000)
    try:
        record.failed(RuntimeError("the run's own error " + "x" * 100_000))
    finally:
        record.close()  # must not raise OSError: [Errno 28]
    assert "Logging error" not in capsys.readouterr().err
