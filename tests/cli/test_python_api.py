"""``flexgraph.runner.Runner``: ``flexgraph run`` from Python, in real processes.

The script under test is MMEngine's ``tools/train.py``, slimmed, with its one
import changed. Run with ``python`` it trains in one process; run with
``python -m torch.distributed.run --nproc-per-node 2`` each copy is a rank of
a DDP run over gloo. Either way each call makes the run folder that
``flexgraph run`` makes, and the console shows flexgraph's lines, not
MMEngine's.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from mmengine.config import Config

from flexgraph.core.strategy import UnknownStrategyError
from flexgraph.runner import Runner, RunnerArgumentError
from tests.cli.cli_helpers import QUICKSTART
from tests.cli.watch_helpers import Run

TRAIN_PY = textwrap.dedent('''
    """MMEngine's tools/train.py, slimmed: the import of Runner is the one change."""
    import argparse
    import os

    from mmengine.config import Config, DictAction

    from flexgraph.runner import Runner  # was: from mmengine.runner import Runner


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("config")
        parser.add_argument("--work-dir")
        parser.add_argument("--cfg-options", nargs="+", action=DictAction)
        parser.add_argument("--launcher", choices=["none", "pytorch", "slurm"], default="none")
        args = parser.parse_args()
        cfg = Config.fromfile(args.config)
        cfg.launcher = args.launcher
        if args.cfg_options is not None:
            cfg.merge_from_dict(args.cfg_options)
        cfg.work_dir = args.work_dir

        runner = Runner.from_cfg(cfg)
        trained = runner.train()

        # beyond tools/train.py: the script goes on, and evaluates what it trained
        context = trained.context["run_context"]
        where = f"rank {context.rank}/{context.world_size}"
        print(f"{where} trained {trained.context['train_result']['iter']} iterations",
              flush=True)
        cfg.load_from = os.path.join(cfg.work_dir, "epoch_1.pth")
        metrics = Runner.from_cfg(cfg).val().context["val_result"]
        print(f"{where} validated: {metrics['accuracy/top1']:.4f}", flush=True)


    if __name__ == "__main__":
        main()
''')

ONE_EPOCH = ["--cfg-options", "train_cfg.max_epochs=1", "train_cfg.val_interval=1"]
INIT_REPORT = "The value is the same before and after calling `init_weights`"
"""What MMEngine's init_weights logs at INFO: in the run's log, never on the console."""


def _run_folders(work: Path) -> list[Path]:
    return sorted(p for p in work.iterdir() if p.is_dir() and p.name[0].isdigit())


def _assert_run_folder(folder: Path, strategy: str, last_step: str) -> str:
    """The files ``flexgraph run`` writes in a run folder; returns its log."""
    assert {p.name for p in folder.iterdir()} >= {f"{folder.name}.log", "config.py",
                                                  "plan.json"}
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["strategy"] == strategy and plan["steps"][-1]["name"] == last_step
    config = Config.fromfile(str(folder / "config.py"))
    assert config.train_cfg.max_epochs == 1  # the script's change, recorded
    return (folder / f"{folder.name}.log").read_text()


@pytest.mark.slow
def test_a_train_script_trains_and_validates_in_one_process(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_PY)
    run = Run([sys.executable, "train.py", str(QUICKSTART), "--work-dir", "work", *ONE_EPOCH],
              cwd=tmp_path).wait()
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.left, f"left behind: {run.left}"
    assert "rank 0/1 trained 45 iterations" in run.stdout
    assert re.search(r"rank 0/1 validated: 0\.\d{4}", run.stdout)
    # flexgraph run's console: its summary, the setup's timings, the last step's outputs
    assert "flexgraph: 13 steps, strategy single" in run.stdout
    assert "step timings" in run.stdout and "train_result: {'iter': 45" in run.stdout
    assert "flexgraph: 9 steps, strategy single" in run.stdout  # the val entry
    # MMEngine's INFO lines go to the run's log, not the console
    console = run.stdout + run.stderr
    assert INIT_REPORT not in console and " - mmengine - " not in console

    train, val = _run_folders(tmp_path / "work")
    assert INIT_REPORT in _assert_run_folder(train, "single", "train")
    assert "Loaded weights from work/epoch_1.pth" in _assert_run_folder(val, "single", "val")


@pytest.mark.slow
def test_a_train_script_under_torchrun_runs_as_its_ranks(tmp_path):
    """``torchrun train.py``: each copy joins the process group the launcher made, DDP by
    default with two processes; rank 0 alone writes each run folder."""
    (tmp_path / "train.py").write_text(TRAIN_PY)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "train.py", str(QUICKSTART), "--work-dir", "work", "--launcher", "pytorch",
            *ONE_EPOCH]
    run = Run(argv, cwd=tmp_path).wait()
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.left, f"left behind: {run.left}"
    # 1437 samples, two ranks, batch 32: 23 iterations each
    for rank in (0, 1):
        assert f"rank {rank}/2 trained 23 iterations" in run.stdout, run.stdout[-3000:]
    scores = re.findall(r"rank [01]/2 validated: (0\.\d{4})", run.stdout)
    assert len(scores) == 2 and scores[0] == scores[1]  # the metric gathered from both
    assert "flexgraph: 13 steps, strategy ddp, launched by torch elastic" in run.stdout
    assert INIT_REPORT not in run.stdout + run.stderr

    work = tmp_path / "work"
    train, val = _run_folders(work)
    _assert_run_folder(train, "ddp", "train")
    _assert_run_folder(val, "ddp", "val")
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if "mode" not in r] == list(range(1, 24)), "one writer"


@pytest.fixture
def quickstart(tmp_path) -> Config:
    cfg = Config.fromfile(str(QUICKSTART))
    cfg.work_dir = str(tmp_path / "work")
    return cfg


def test_a_strategy_it_does_not_know_is_refused_before_anything_is_written(quickstart):
    with pytest.raises(UnknownStrategyError, match=r"unknown strategy 'fsdpp' \(did you mean "
                                                   r"'fsdp'\?\)"):
        Runner.from_cfg(quickstart, strategy="fsdpp").train()
    assert not Path(quickstart.work_dir).exists()


def test_a_strategy_dict_replaces_the_configs_own_and_leaves_the_callers_config(quickstart):
    quickstart.strategy = dict(type="FSDPStrategy", reshard_after_forward=False)
    with pytest.raises(UnknownStrategyError, match="unknown strategy 'NoSuch'"):
        Runner.from_cfg(quickstart, strategy=dict(type="NoSuch")).train()
    assert quickstart.strategy == dict(type="FSDPStrategy", reshard_after_forward=False)
    assert not Path(quickstart.work_dir).exists()


@pytest.mark.parametrize("cfg, strategy, message", [
    (3, None, "Runner's cfg must be an mmengine Config, a dict or the path of a config, not int"),
    (str(QUICKSTART), 2, r"Runner's strategy must be a name \('ddp', 'auto', \.\.\.\) or "
                         r"dict\(type=\.\.\., \*\*options\), not int"),
    (str(QUICKSTART), {"zero": 1}, "Runner's strategy {'zero': 1} has no type"),
], ids=["cfg", "strategy", "no-type"])
def test_what_it_cannot_run_is_refused_in_one_line(cfg, strategy, message):
    with pytest.raises(RunnerArgumentError, match=message):
        Runner.from_cfg(cfg, strategy=strategy)


def test_a_strategy_dict_needs_a_config_not_a_pipeline():
    pipeline = QUICKSTART.parent / "textstats.yaml"
    with pytest.raises(RunnerArgumentError, match="textstats.yaml is a pipeline, not a config"):
        Runner.from_cfg(pipeline, strategy=dict(type="DDPStrategy")).train()
