"""``runner.visualizer`` is built as MMEngine's Runner builds it, and gets each scalar once.

Hooks such as MMPreTrain's, MMDetection's and MMSegmentation's visualization
hooks call ``Visualizer.get_current_instance()`` in their constructors and draw
with it during validation; the backends get flexgraph's scalars under
MMEngine's LoggerHook's tags and steps, ``LocalVisBackend`` included (its
scalars.json), with the values MMEngine's LogProcessor logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, VISBACKENDS
from mmengine.visualization import (
    LocalVisBackend,
    TensorboardVisBackend,
    Visualizer,
)
from mmengine.visualization.vis_backend import BaseVisBackend

from flexgraph.cli.main import main
from flexgraph.training.errors import ConfigError, UnknownComponentError
from tests.training.training_helpers import REPO, ToyDataset, build_hooks, run_steps


@HOOKS.register_module(force=True)
class DrawingHook(Hook):
    """Looks the visualizer up when built, as the OpenMMLab visualization hooks do,
    and draws one image per validation batch, shaded by the batch's index."""

    def __init__(self) -> None:
        self.visualizer = Visualizer.get_current_instance()

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.visualizer is not self.visualizer:
            raise AssertionError("runner.visualizer is not the current Visualizer")
        image = np.full((4, 6, 3), 40 * (batch_idx + 1), dtype=np.uint8)
        self.visualizer.add_image(f"batch{batch_idx}", image, step=runner.epoch)


@VISBACKENDS.register_module(force=True)
class RecordingVisBackend(BaseVisBackend):
    """A backend that keeps what it is given (every backend but LocalVisBackend gets
    scalars through its ``add_scalars``)."""

    def __init__(self, save_dir: str | None = None) -> None:
        super().__init__(save_dir)
        self.scalars: list[tuple[dict, int]] = []
        self.closed = False

    @property
    def experiment(self):
        return self

    def _init_env(self) -> None:
        pass

    def add_scalars(self, scalar_dict, step=0, file_path=None, **kwargs) -> None:
        self.scalars.append((scalar_dict, step))

    def close(self) -> None:
        self.closed = True


@DATASETS.register_module(force=True)
class TrainNamesDataset(ToyDataset):
    metainfo = {"classes": ("train-a", "train-b", "train-c")}


@DATASETS.register_module(force=True)
class ValNamesDataset(ToyDataset):
    metainfo = {"classes": ("low", "mid", "high")}


CONFIG = textwrap.dedent("""
    model = dict(type='ToyNet')
    train_dataloader = dict(batch_size=4, num_workers=0, dataset=dict(type='ToyDataset'),
                            sampler=dict(type='DefaultSampler', shuffle=True))
    val_dataloader = dict(batch_size=10, dataset=dict(type='ToyDataset', n=20, seed=1),
                          sampler=dict(type='DefaultSampler', shuffle=False))
    optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
    train_cfg = dict(by_epoch=True, max_epochs=2)
    default_hooks = dict(checkpoint=None, visualization=dict(type='DrawingHook'))
""")


def test_a_hook_finds_the_visualizer_when_built_and_draws_into_the_run_folder(tmp_path):
    (tmp_path / "cfg.py").write_text(CONFIG)
    assert main(["run", str(tmp_path / "cfg.py"), "--work-dir", str(tmp_path / "work")]) == 0
    (run_dir,) = [p for p in (tmp_path / "work").iterdir() if p.is_dir()]
    images = run_dir / "vis_data" / "vis_image"
    assert sorted(p.name for p in images.iterdir()) == [
        "batch0_1.png", "batch0_2.png", "batch1_1.png", "batch1_2.png"]
    assert cv2.imread(str(images / "batch1_2.png"))[0, 0].tolist() == [80, 80, 80]
    # LocalVisBackend gets the scalars (scalars.json, and {timestamp}.json as MMEngine's
    # LoggerHook asks), not the config (the run folder's config.py is it)
    assert sorted(p.name for p in (run_dir / "vis_data").iterdir()) == [
        f"{run_dir.name}.json", "scalars.json", "vis_image"]
    records = (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["epoch"] for r in records if "mode" in json.loads(r)] == [1, 2]


def test_runner_visualizer_is_the_configs_with_its_name_save_dir_and_backends(make_cfg,
                                                                            tmp_path):
    name = f"vis_{tmp_path.name}"
    cfg = make_cfg(visualizer=dict(type="Visualizer", name=name,
                                   save_dir=str(tmp_path / "elsewhere"),
                                   vis_backends=[dict(type="LocalVisBackend"),
                                                 dict(type="TensorboardVisBackend")]))
    visualizer = build_hooks(cfg).runner.visualizer
    assert visualizer is Visualizer.get_current_instance()
    assert type(visualizer) is Visualizer and visualizer.instance_name == name
    backends = visualizer._vis_backends
    assert [type(b) for b in backends.values()] == [LocalVisBackend, TensorboardVisBackend]
    assert {b._save_dir for b in backends.values()} == {str(tmp_path / "elsewhere/vis_data")}
    # the same name in a later run of this process: a visualizer of its own
    again = build_hooks(cfg).runner.visualizer
    assert again is not visualizer and again.instance_name.startswith(f"{name}_")


@pytest.mark.slow
def test_without_a_visualizer_the_default_is_built_when_first_asked_for(tmp_path):
    """In a fresh process, as ``flexgraph run`` is: building one costs a start 0.5 s."""
    probe = textwrap.dedent(f"""
        import sys
        from tests.training.training_helpers import build_hooks, toy_cfg
        runner = build_hooks(toy_cfg({str(tmp_path / "work")!r})).runner
        print(runner.built_visualizer() is None, "matplotlib" in sys.modules)
        print(type(runner.visualizer).__name__, "matplotlib" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["True", "False", "Visualizer", "True"]


def test_without_a_visualizer_the_default_is_mmengines(make_cfg):
    runner = build_hooks(make_cfg()).runner
    visualizer = runner.visualizer
    assert type(visualizer) is Visualizer
    assert visualizer.instance_name.startswith(runner.experiment_name)
    (backend,) = visualizer._vis_backends.values()
    assert type(backend) is LocalVisBackend
    assert backend._save_dir == str(Path(runner.log_dir) / "vis_data")


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def _train_records(work: Path) -> list[dict]:
    lines = (work / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "mode" not in r]


def test_tensorboard_gets_each_scalar_once_under_mmengines_tags_and_steps(make_cfg,
                                                                          tmp_path):
    cfg = make_cfg(visualizer=dict(vis_backends=[dict(type="LocalVisBackend"),
                                                 dict(type="TensorboardVisBackend")]))
    result = run_steps(cfg)["train_result"]
    vis_data = tmp_path / "work" / "vis_data"  # runner.log_dir: work_dir outside a CLI run
    events = _events(vis_data)
    assert set(events) == {"loss", "lr", "epoch", "iter"}
    line_steps = [5, 10, 15, 20, 25, 30]  # a log line every 5 of 30 iterations
    assert [step for step, _ in events["lr"]] == line_steps
    assert events["iter"] == [(s, float(s)) for s in line_steps]
    assert events["epoch"] == [(s, float((s - 1) // 10 + 1)) for s in line_steps]
    records = _train_records(tmp_path / "work")
    # MMEngine's LogProcessor: a loss is the mean over its window, the last 10 iterations
    train_loss = [(s, v) for s, v in events["loss"] if s in line_steps]
    assert train_loss == [(s, pytest.approx(
        np.mean([r["loss"] for r in records[max(0, s - 10):s]]), rel=1e-6))
        for s in line_steps]
    # the validation's loss, at the epoch (MMEngine's tag: 'loss' too): a loss, so the
    # mean over the last 10 validations' values, as MMEngine's LogProcessor has it
    val_loss = [(s, v) for s, v in events["loss"] if s not in line_steps]
    assert [s for s, _ in val_loss] == [1, 2, 3]
    val_records = [r["loss"] for r in map(json.loads, (tmp_path / "work" / "metrics.jsonl")
                                          .read_text().splitlines()) if r.get("mode") == "val"]
    assert val_records[-1] == pytest.approx(result["val/loss"], rel=1e-6)
    assert [v for _, v in val_loss] == pytest.approx(
        [np.mean(val_records[:k]) for k in (1, 2, 3)], rel=1e-6)
    # the LocalVisBackend's scalar files hold the same values; no config.py
    assert sorted(p.name for p in vis_data.iterdir()) == sorted([
        next(vis_data.glob("events.out.tfevents.*")).name, "scalars.json",
        next(vis_data.glob("2*.json")).name])
    scalars = [json.loads(line) for line in (vis_data / "scalars.json").read_text()
               .splitlines()]
    assert [(r["step"], r["loss"]) for r in scalars if "iter" in r] == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in train_loss]


def test_an_iteration_loop_hands_validation_over_at_the_iteration(make_cfg, tmp_path):
    cfg = make_cfg(train_cfg=dict(by_epoch=False, max_iters=12, val_interval=6),
                   default_hooks=dict(checkpoint=None, logger=dict(interval=4)),
                   visualizer=dict(vis_backends=[dict(type="TensorboardVisBackend")]))
    run_steps(cfg)
    events = _events(tmp_path / "work" / "vis_data")
    assert set(events) == {"loss", "lr", "iter"}  # no epoch: MMEngine's by_epoch=False
    assert [s for s, _ in events["lr"]] == [4, 8, 12]
    assert [s for s, _ in events["loss"]] == [4, 6, 8, 12, 12]


def test_backends_get_the_scalars_in_order_and_are_closed(make_cfg):
    cfg = make_cfg(visualizer=dict(vis_backends=[dict(type="RecordingVisBackend")]))
    ctx = run_steps(cfg)
    (backend,) = ctx["hooks"].runner.visualizer._vis_backends.values()
    assert backend.closed
    assert [step for _, step in backend.scalars] == [5, 10, 1, 15, 20, 2, 25, 30, 3]
    assert set(backend.scalars[0][0]) == {"loss", "lr", "epoch", "iter"}
    assert set(backend.scalars[2][0]) == {"loss"}  # validation


def test_the_val_entry_hands_its_metrics_over_at_step_0_and_test_none(make_cfg):
    cfg = make_cfg(visualizer=dict(vis_backends=[dict(type="RecordingVisBackend")]),
                   test_dataloader=make_cfg().val_dataloader)
    val = run_steps(cfg, last="val")
    (backend,) = val["hooks"].runner.visualizer._vis_backends.values()
    assert backend.scalars == [({"loss": pytest.approx(val["val_result"]["loss"])}, 0)]
    test = run_steps(cfg, last="test")
    (backend,) = test["hooks"].runner.visualizer._vis_backends.values()
    assert backend.scalars == [] and backend.closed  # MMEngine's LoggerHook: none for test


def test_a_misspelled_backend_gets_a_did_you_mean(make_cfg):
    cfg = make_cfg(visualizer=dict(vis_backends=[dict(type="TensorbordVisBackend")]))
    with pytest.raises(UnknownComponentError,
                       match=r"visualizer.vis_backends\[0\].*did you mean 'TensorboardVisBackend'"):
        build_hooks(cfg)


def test_a_visualizer_that_is_no_dict_is_refused_by_name(make_cfg):
    with pytest.raises(ConfigError, match="visualizer must be a dict"):
        build_hooks(make_cfg(visualizer=["Visualizer"]))


def test_the_visualizer_gets_the_datasets_metainfo_as_mmengines_loops_give_it(make_cfg):
    """The train loop's, then the validation loop's: drawing hooks read class names there."""
    cfg = make_cfg(train_cfg=dict(by_epoch=True, max_epochs=1))
    cfg.train_dataloader.dataset.type = "TrainNamesDataset"
    cfg.val_dataloader.dataset.type = "ValNamesDataset"
    visualizer = run_steps(cfg)["hooks"].runner.visualizer
    assert visualizer.dataset_meta == {"classes": ("low", "mid", "high")}
    cfg.val_dataloader = None
    visualizer = run_steps(cfg)["hooks"].runner.visualizer
    assert visualizer.dataset_meta == {"classes": ("train-a", "train-b", "train-c")}
