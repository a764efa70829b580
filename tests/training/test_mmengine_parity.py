"""Behaviour parity with MMEngine's ``Runner``, checked against the Runner itself.

Each case runs one config twice, under MMEngine's ``Runner`` (on the CPU:
``launcher='none'``, gloo) and under flexgraph (the standard graph, as
``flexgraph run`` plans it), and compares what a user can observe: every hook
call with ``runner.epoch`` / ``runner.iter`` / ``batch_idx`` and the learning
rate the hook sees, the data each iteration trains on, the checkpoint meta
``before_save_checkpoint`` sees, the checkpoints left in ``work_dir``, the
train log lines, every iteration's losses and the final weights, bit for bit
(the arithmetic is the same: a step-API model trained through MMEngine's own
``train_step`` and optimizer wrappers). The configs follow MMEngine's runner
tests: the toy model, dataset and metric, an epoch and an iteration loop,
``save_best``, hooks at LOW priority, the logger's interval, and a GAN with
two optimizers. The last cases train randomly the ways real configs do
(dropout and drop-path, a batch augmentation, random transforms in the
dataloader workers or in the main process), so that they pass only if every
random stream draws what MMEngine's Runner draws.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseDataPreprocessor, BaseModel
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapperDict
from mmengine.registry import (
    DATA_SAMPLERS,
    DATASETS,
    HOOKS,
    METRICS,
    MODELS,
    OPTIM_WRAPPER_CONSTRUCTORS,
)
from torch import nn

from flexgraph.training.components._data import DATALOADER_KEYS
from flexgraph.training.errors import UnusedConfigWarning
from tests.training.training_helpers import assert_same_logged_values, run_steps, scalars_json

pytestmark = pytest.mark.slow

# -- MMEngine's runner-test components (tiny) -----------------------------------------


@MODELS.register_module(force=True)
class ParityModel(BaseModel):
    """MMEngine's test ToyModel: two linear layers, a regression loss."""

    def __init__(self, data_preprocessor: Any = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.linear1 = nn.Linear(2, 2)
        self.linear2 = nn.Linear(2, 1)

    def forward(self, inputs, data_sample, mode="tensor"):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        target = torch.stack(data_sample) if isinstance(data_sample, list) else data_sample
        outputs = self.linear2(self.linear1(inputs)).squeeze(1)
        if mode == "loss":
            return {"loss": ((target - outputs) ** 2).mean()}
        return outputs


@MODELS.register_module(force=True)
class RandomParityModel(BaseModel):
    """ParityModel with dropout and a drop-path, both drawing from the global torch RNG."""

    def __init__(self, data_preprocessor: Any = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.linear1 = nn.Linear(2, 4)
        self.dropout = nn.Dropout(0.3)
        self.linear2 = nn.Linear(4, 1)

    def forward(self, inputs, data_sample, mode="tensor"):
        hidden = self.dropout(self.linear1(torch.stack(inputs)))
        if self.training:  # drop-path: each sample's branch is dropped or rescaled
            keep = (torch.rand(len(hidden), 1) > 0.25).to(hidden.dtype)
            hidden = hidden * keep / 0.75
        outputs = self.linear2(hidden).squeeze(1)
        if mode == "loss":
            return {"loss": ((torch.stack(data_sample) - outputs) ** 2).mean()}
        return outputs


@MODELS.register_module(force=True)
class MixBatch(BaseDataPreprocessor):
    """A batch augmentation of the main process, as Mixup is: whether to mix
    from python's random, the ratio from numpy, the partners from torch."""

    def forward(self, data: dict, training: bool = False) -> dict:
        data = super().forward(data, training)
        if not training or random.random() < 0.25:
            return data
        ratio = float(np.random.beta(0.8, 0.8))
        inputs, targets = torch.stack(data["inputs"]), torch.stack(data["data_sample"])
        partner = torch.randperm(len(inputs))
        return dict(data, inputs=list(ratio * inputs + (1 - ratio) * inputs[partner]),
                    data_sample=list(ratio * targets + (1 - ratio) * targets[partner]))


@MODELS.register_module(force=True)
class ScaleInputs(BaseDataPreprocessor):
    """A data preprocessor that changes the data, so that leaving it out shows."""

    def forward(self, data: dict, training: bool = False) -> dict:
        data = super().forward(data, training)
        return dict(data, inputs=[2 * x for x in data["inputs"]])


@MODELS.register_module(force=True)
class ParityGAN(BaseModel):
    """MMEngine's test ToyGANModel: one optimizer per linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(2, 1)
        self.linear2 = nn.Linear(2, 1)

    def forward(self, inputs, data_sample, mode="tensor"):
        inputs, target = torch.stack(inputs), torch.stack(data_sample)
        out1, out2 = self.linear1(inputs).squeeze(1), self.linear2(inputs).squeeze(1)
        if mode == "loss":
            return {"linear1": ((target - out1) ** 2).mean(),
                    "linear2": ((target - out2) ** 2).mean()}
        return out1, out2

    def train_step(self, data, optim_wrapper):
        losses = self(**self.data_preprocessor(data, True), mode="loss")
        optim_wrapper["linear1"].update_params(losses["linear1"])
        optim_wrapper["linear2"].update_params(losses["linear2"])
        return losses


@OPTIM_WRAPPER_CONSTRUCTORS.register_module(force=True)
class ParityGANConstructor:
    """MMEngine's test constructor: an OptimWrapperDict, one wrapper per sub-module."""

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Any = None) -> None:
        self.constructors = {key: DefaultOptimWrapperConstructor(dict(cfg))
                             for key, cfg in optim_wrapper_cfg.items()}

    def __call__(self, model: nn.Module) -> OptimWrapperDict:
        return OptimWrapperDict(**{key: constructor(getattr(model, key))
                                   for key, constructor in self.constructors.items()})


@DATASETS.register_module(force=True)
class ParityData(torch.utils.data.Dataset):
    """``n`` fixed samples as MMEngine's test dataset yields them (dicts)."""

    metainfo: dict[str, Any] = {}

    def __init__(self, n: int = 12) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(n, 2, generator=g)
        self.label = torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"inputs": self.data[i], "data_sample": self.label[i]}


@DATASETS.register_module(force=True)
class AugmentedParityData(ParityData):
    """ParityData with a random transform that draws from numpy, python's random and
    torch wherever it runs: in the dataloader workers, or in the main process."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = super().__getitem__(i)
        noise = (torch.randn(2) + torch.from_numpy(np.random.normal(size=2)).float()
                 + random.gauss(0.0, 1.0))
        return dict(item, inputs=item["inputs"] + 0.1 * noise)


@METRICS.register_module(force=True)
class ScriptedMetric(BaseMetric):
    """Reports ``acc`` and ``mse`` from a script, one value per evaluation, so that
    the best checkpoint changes hands in a known, non-monotonic way."""

    ACC = (0.5, 0.7, 0.6, 0.9, 0.8, 0.95)
    MSE = (3.0, 2.0, 2.5, 1.0, 1.5, 0.5)

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def process(self, data_batch, data_samples) -> None:
        self.results.append(0)

    def compute_metrics(self, results) -> dict[str, float]:
        self.calls += 1
        return {"acc": self.ACC[self.calls - 1], "mse": self.MSE[self.calls - 1]}


_POINTS = ("before_run", "after_run", "before_train", "after_train", "before_train_epoch",
           "after_train_epoch", "before_train_iter", "after_train_iter", "before_val",
           "after_val", "before_val_epoch", "after_val_epoch", "before_val_iter",
           "after_val_iter", "before_save_checkpoint", "after_load_checkpoint")


@HOOKS.register_module(force=True)
class ParityRecorder(Hook):
    """Appends each call to ``LOG``: hook name, point, counters, batch index, the LRs."""

    LOG: list[tuple[Any, ...]] = []
    DATA: list[torch.Tensor] = []
    LOSSES: list[dict[str, float]] = []

    def __init__(self, name: str) -> None:
        self.name = name

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._record("before_train_iter", runner, batch_idx=batch_idx)
        if self.name == "normal":
            ParityRecorder.DATA.append(torch.stack(data_batch["inputs"]).clone())

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._record("after_train_iter", runner, batch_idx=batch_idx)
        if self.name == "normal":
            ParityRecorder.LOSSES.append({k: float(v) for k, v in outputs.items()})

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        meta = checkpoint["meta"]
        self._record("before_save_checkpoint", runner, saved=(meta["epoch"], meta["iter"]),
                     optimizer="optimizer" in checkpoint)

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._record("after_val_epoch", runner, metrics=dict(metrics or {}))

    def _record(self, point: str, runner: Any, **extra: Any) -> None:
        lrs = runner.optim_wrapper.get_lr() if runner.optim_wrapper is not None else {}
        lrs = tuple(sorted((k, tuple(v)) for k, v in lrs.items()))
        ParityRecorder.LOG.append((self.name, point, runner.epoch, runner.iter, lrs,
                                   tuple(sorted(extra.items()))))


def _recorder(point: str):
    def record(self, runner, batch_idx=None, **kwargs):
        self._record(point, runner, batch_idx=batch_idx)
    record.__name__ = point
    return record


for _point in _POINTS:
    if _point not in vars(ParityRecorder):
        setattr(ParityRecorder, _point, _recorder(_point))


@HOOKS.register_module(force=True)
class TrainLogCapture(Hook):
    """Collects the (epoch, batch) of the runner's train log lines, whatever their format."""

    priority = "HIGHEST"
    LINES: list[tuple[int, ...]] = []
    TEXT: list[str] = []  # every train and val line, whole

    def before_run(self, runner) -> None:
        capture = logging.Handler()
        capture.emit = self._emit
        runner.logger.addHandler(capture)
        self._handler = (runner.logger, capture)

    def after_run(self, runner) -> None:
        logger, capture = self._handler
        logger.removeHandler(capture)

    @staticmethod
    def _emit(record: logging.LogRecord) -> None:
        text = record.getMessage()
        if re.search(r"(Epoch|Iter)\((train|val)\)", text):
            TrainLogCapture.TEXT.append(text)
        epoch = re.search(r"Epoch\(train\)\s*\[(\d+)(?:/\d+)?\]\[\s*(\d+)/", text)
        it = re.search(r"Iter\(train\)\s*\[\s*(\d+)/", text)
        if epoch:
            TrainLogCapture.LINES.append((int(epoch[1]), int(epoch[2])))
        elif it:  # an iteration loop is epoch 1 (MMEngine's default LogProcessor says so)
            TrainLogCapture.LINES.append((1, int(it[1])))


# -- the two runners ----------------------------------------------------------------------

def _base_cfg(**overrides: Any) -> dict[str, Any]:
    """MMEngine's runner-test epoch config, tiny: 12 samples, batch 3, 3 epochs."""
    cfg = dict(
        model=dict(type="ParityModel"),
        train_dataloader=dict(dataset=dict(type="ParityData"), batch_size=3, num_workers=0,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        val_dataloader=dict(dataset=dict(type="ParityData", n=6), batch_size=3,
                            num_workers=0, sampler=dict(type="DefaultSampler", shuffle=False)),
        val_evaluator=dict(type="ScriptedMetric"),
        val_cfg=dict(),
        optim_wrapper=dict(type="OptimWrapper",
                           optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        param_scheduler=dict(type="MultiStepLR", milestones=[1, 2], by_epoch=True),
        train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1)),
        custom_hooks=[dict(type="ParityRecorder", name="normal"),
                      dict(type="ParityRecorder", name="low", priority="LOW"),
                      dict(type="ParityRecorder", name="lowest", priority="LOWEST")],
        launcher="none",
        env_cfg=dict(dist_cfg=dict(backend="gloo")),
        randomness=dict(seed=7),
        log_level="WARNING",
    )
    cfg.update(copy.deepcopy(overrides))
    return cfg


def _observed(work_dir: Path, model: nn.Module) -> dict[str, Any]:
    files = sorted(p.name for p in work_dir.iterdir() if p.suffix == ".pth")
    pointer = work_dir / "last_checkpoint"
    return {
        "hooks": list(ParityRecorder.LOG),
        "data": list(ParityRecorder.DATA),
        "losses": list(ParityRecorder.LOSSES),
        "log_lines": list(TrainLogCapture.LINES),
        "log_text": list(TrainLogCapture.TEXT),
        # MMEngine's in its timestamped folder, flexgraph's in runner.log_dir (the
        # work_dir outside flexgraph run)
        "scalars": scalars_json(work_dir),
        "checkpoints": [re.sub(r"-[0-9a-f]{8}\.pth$", "-<sha>.pth", f) for f in files],
        "last_checkpoint": Path(pointer.read_text().strip()).name if pointer.exists() else None,
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def _reset() -> None:
    ParityRecorder.LOG, ParityRecorder.DATA, TrainLogCapture.LINES = [], [], []
    TrainLogCapture.TEXT = []
    ParityRecorder.LOSSES = []


def run_mmengine(cfg: dict[str, Any], work_dir: Path, monkeypatch) -> dict[str, Any]:
    from mmengine.runner import Runner, loops

    _reset()
    with monkeypatch.context() as patch:
        # Its iteration loop sleeps 2 s at each pass over the data ("prevent possible
        # deadlock" with workers); the few batches here end in time without it.
        patch.setattr(loops.time, "sleep", lambda seconds: None)
        # MMEngine reads its own checkpoints (published_keys) with torch.load's
        # default, which refuses the objects it writes under current torch.
        patch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
        # MMEngine's default name, the second it starts, would hand a Runner started in
        # the second an earlier run of this process started that run's visualizer and
        # logger, which write into that run's (by now removed) folder.
        name = cfg.get("experiment_name", f"{work_dir.parent.name}-{work_dir.name}")
        runner = Runner.from_cfg(Config(dict(cfg, work_dir=str(work_dir),
                                             experiment_name=name)))
        runner.train()
    _end_persistent_workers(*(loop.dataloader for loop in (runner.train_loop, runner.val_loop)
                              if loop is not None))
    return _observed(work_dir, runner.model)


def run_flexgraph(cfg: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    _reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedConfigWarning)  # every key here is acted on
        context = run_steps(Config(dict(cfg, work_dir=str(work_dir))),
                            setup_env={"device": "cpu"})
    _end_persistent_workers(*(context[key] for key in DATALOADER_KEYS))
    return _observed(work_dir, context["model"])


def _end_persistent_workers(*loaders: Any) -> None:
    """Free the iterators that persistent workers keep, so that torch ends them now.

    Both runners keep their loaders in reference cycles. Freed by the garbage
    collector later, an iterator's queues are finalised before it asks its
    workers to stop, and it waits 5 s for each of them in vain.
    """
    for loader in loaders:
        if getattr(loader, "_iterator", None) is not None:
            loader._iterator = None


def assert_same_run(mm: dict[str, Any], fg: dict[str, Any]) -> None:
    for key in ("checkpoints", "last_checkpoint", "log_lines"):
        assert fg[key] == mm[key], key
    assert len(fg["hooks"]) == len(mm["hooks"])
    for i, (a, b) in enumerate(zip(mm["hooks"], fg["hooks"], strict=True)):
        assert b == a, f"hook call {i}: MMEngine {a}, flexgraph {b}"
    assert len(fg["data"]) == len(mm["data"])
    assert all(torch.equal(a, b) for a, b in zip(mm["data"], fg["data"], strict=True))
    assert len(fg["losses"]) == len(mm["losses"])
    for i, (a, b) in enumerate(zip(mm["losses"], fg["losses"], strict=True)):
        assert b == a, f"iteration {i}: MMEngine's losses {a}, flexgraph's {b}"
    assert fg["weights"].keys() == mm["weights"].keys()
    for key, value in mm["weights"].items():
        assert torch.equal(fg["weights"][key], value), key


@pytest.fixture
def compare(tmp_path, monkeypatch):
    """``compare(cfg)``: run ``cfg`` under both runners and assert they behaved the same."""
    torch.set_num_threads(1)

    def run(cfg: dict[str, Any]) -> dict[str, Any]:
        mm = run_mmengine(cfg, tmp_path / "mmengine", monkeypatch)
        fg = run_flexgraph(cfg, tmp_path / "flexgraph")
        assert_same_run(mm, fg)
        return {**fg, "mmengine": mm}

    return run


def _points(run: dict[str, Any], name: str, point: str) -> list[tuple[Any, ...]]:
    return [call for call in run["hooks"] if call[0] == name and call[1] == point]


# -- the cases ---------------------------------------------------------------------------

def test_epoch_loop(compare):
    # a top-level data_preprocessor is the model's (MMEngine's Runner merges it in)
    run = compare(_base_cfg(data_preprocessor=dict(type="ScaleInputs")))
    assert run["checkpoints"] == ["epoch_1.pth", "epoch_2.pth", "epoch_3.pth"]
    # LOW hooks run after ParamSchedulerHook: they see the LR the epoch ends with
    low, normal = (_points(run, n, "after_train_epoch") for n in ("low", "normal"))
    assert [c[4] for c in normal] != [c[4] for c in low]


@pytest.mark.parametrize("checkpoint", [
    dict(type="CheckpointHook", interval=3, by_epoch=False, max_keep_ckpts=2),
    dict(type="CheckpointHook", interval=1),  # an epoch interval: epoch_1 at the end
], ids=["iter-interval", "epoch-interval"])
def test_iteration_loop(compare, checkpoint):
    # 4 batches per pass: 10 iterations make 2.5 passes, still one epoch to hooks
    run = compare(_base_cfg(
        train_cfg=dict(by_epoch=False, max_iters=10, val_interval=4),
        param_scheduler=[dict(type="LinearLR", start_factor=0.25, by_epoch=False, end=5),
                         dict(type="MultiStepLR", milestones=[1], by_epoch=True)],
        default_hooks=dict(checkpoint=checkpoint),
    ))
    assert {call[2] for call in run["hooks"]} == {0}  # runner.epoch
    assert len(run["data"]) == 10


@pytest.mark.parametrize("options, kept", [
    (dict(interval=2, max_keep_ckpts=2, save_best=["acc", "mse"], less_keys=["mse"],
          published_keys=["meta", "state_dict"]),
     ["best_acc_epoch_4.pth", "best_acc_epoch_4-<sha>.pth", "best_mse_epoch_4.pth",
      "best_mse_epoch_4-<sha>.pth", "epoch_4.pth", "epoch_5.pth", "epoch_5-<sha>.pth"]),
    (dict(interval=1, save_best="auto", rule="less", save_begin=2, save_last=False),
     ["best_acc_epoch_1.pth", "epoch_2.pth", "epoch_3.pth", "epoch_4.pth", "epoch_5.pth"]),
], ids=["two-metrics-publish", "auto-rule-save-begin"])
def test_save_best(compare, options, kept):
    run = compare(_base_cfg(train_cfg=dict(by_epoch=True, max_epochs=5, val_interval=1),
                            default_hooks=dict(checkpoint=dict(type="CheckpointHook",
                                                               **options))))
    assert sorted(run["checkpoints"]) == sorted(kept)


@pytest.mark.parametrize("train_cfg, logger", [
    (dict(by_epoch=True, max_epochs=2), dict(interval=3)),
    (dict(by_epoch=True, max_epochs=2), dict(interval=3, ignore_last=False)),
    (dict(by_epoch=False, max_iters=11), dict(interval=3, ignore_last=False)),
], ids=["epoch", "epoch-last", "iter-last"])
def test_logger_interval(compare, train_cfg, logger):
    run = compare(_base_cfg(
        train_dataloader=dict(dataset=dict(type="ParityData", n=15), batch_size=3,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(train_cfg, val_interval=100), log_level="INFO",
        default_hooks=dict(logger=dict(type="LoggerHook", **logger),
                           checkpoint=None),
        custom_hooks=[dict(type="TrainLogCapture")]))
    assert run["log_lines"]


# -- what is logged: log_processor's statistics, in the lines and in scalars.json ----------

def fg_metrics(work_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (work_dir / "metrics.jsonl").read_text().splitlines()]


_LOGGED_RUN = dict(
    train_dataloader=dict(dataset=dict(type="ParityData", n=15), batch_size=3,
                          sampler=dict(type="DefaultSampler", shuffle=True)),
    train_cfg=dict(by_epoch=True, max_epochs=4, val_interval=2), log_level="INFO",
    default_hooks=dict(logger=dict(type="LoggerHook", interval=2), checkpoint=None),
    custom_hooks=[dict(type="TrainLogCapture")])


@pytest.mark.parametrize("overrides", [
    {},  # MMEngine's default log_processor: the mean over 10 iterations, across epochs
    dict(log_processor=dict(window_size=3)),
    dict(log_processor=dict(by_epoch=False),  # as MMEngine's iteration-based configs
         train_cfg=dict(by_epoch=False, max_iters=13, val_interval=6),
         default_hooks=dict(logger=dict(type="LoggerHook", interval=2,
                                        log_metric_by_epoch=False), checkpoint=None)),
    dict(log_processor=dict(by_epoch=False, window_size=4),
         default_hooks=dict(logger=dict(type="LoggerHook", interval=3, ignore_last=False),
                            checkpoint=None)),
    dict(log_processor=dict(window_size=5, custom_cfg=[
        dict(data_src="loss", method_name="max", window_size=3, log_name="loss_max"),
        dict(data_src="loss", method_name="min", window_size="epoch", log_name="loss_min"),
        dict(data_src="loss", method_name="mean", window_size="global",
             log_name="loss_global"),
        dict(data_src="lr", method_name="mean", window_size=4, log_name="lr_mean"),
        dict(data_src="acc", method_name="max", log_name="acc_best")])),
    # the optimizer wrapper's grad_norm, which it writes into the hub every iteration
    dict(optim_wrapper=dict(type="OptimWrapper", clip_grad=dict(max_norm=0.5),
                            optimizer=dict(type="SGD", lr=0.1, momentum=0.9))),
    # a hook that runs every iteration: each line is composed when due
    dict(custom_hooks=[dict(type="TrainLogCapture"), dict(type="ParityRecorder", name="normal")],
         log_processor=dict(window_size=4)),
], ids=["default", "window-3", "iteration-by-iter", "epoch-loop-by-iter", "custom-cfg",
        "grad-norm", "hooks-every-iteration"])
def test_logged_values_equal_the_runners(compare, overrides, tmp_path):
    """Each key's value in the log lines and in scalars.json, for the same run, is the
    Runner's: MMEngine's LogProcessor statistics, not the iteration's raw value."""
    # a name of its own: MMEngine's Runner reuses the Visualizer of an earlier run with
    # the same name (its timestamp, to the second), which writes into that run's folder
    cfg = _base_cfg(**_LOGGED_RUN, experiment_name=tmp_path.name)
    cfg.update(copy.deepcopy(overrides))
    fg = compare(cfg)
    mm = fg["mmengine"]
    assert_same_logged_values(mm["scalars"], fg["scalars"], mm["log_text"], fg["log_text"])
    # metrics.jsonl keeps each iteration's raw loss; the lines show a window's statistics
    metrics = fg_metrics(tmp_path / "flexgraph")
    raw = {record["iter"]: record["loss"] for record in metrics if "mode" not in record}
    lines = [line for line in fg["scalars"] if "iter" in line]
    assert sorted(raw) == list(range(1, len(raw) + 1))
    assert any(line["loss"] != raw[line["iter"]] for line in lines)


@pytest.mark.parametrize("param_scheduler", [
    dict(type="MultiStepLR", milestones=[2, 5], by_epoch=False),
    dict(linear1=dict(type="MultiStepLR", milestones=[2], by_epoch=False),
         linear2=[dict(type="LinearLR", start_factor=0.5, by_epoch=False, end=4),
                  dict(type="MultiStepLR", milestones=[1], by_epoch=True, gamma=0.5)]),
], ids=["one-for-both", "per-optimizer"])
def test_gan_with_two_optimizers(compare, param_scheduler):
    run = compare(_base_cfg(
        model=dict(type="ParityGAN"),
        optim_wrapper=dict(constructor="ParityGANConstructor",
                           linear1=dict(optimizer=dict(type="SGD", lr=0.1)),
                           linear2=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9))),
        param_scheduler=param_scheduler,
        train_cfg=dict(by_epoch=True, max_epochs=2),
        val_dataloader=None, val_evaluator=None, val_cfg=None))
    lrs = {call[4] for call in _points(run, "low", "after_train_iter")}
    assert len(lrs) > 2  # both optimizers' LRs moved, as their schedulers say


# -- random training: every random stream as MMEngine's Runner draws it ------------------

def _random_cfg(loader: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """Two epochs of training that draws from every global RNG, validated once it is over.

    The validation dataloader is built (MMEngine builds it before training, and
    what building draws counts) but runs only after the last epoch: validation
    in between is a deliberate difference (it leaves the RNG as it found them).
    """
    def dataloader(n: int, shuffle: bool) -> dict[str, Any]:
        return dict(dataset=dict(type="AugmentedParityData", n=n), batch_size=3,
                    sampler=dict(type="DefaultSampler", shuffle=shuffle), **loader)

    return _base_cfg(**{
        "model": dict(type="RandomParityModel"), "data_preprocessor": dict(type="MixBatch"),
        "train_dataloader": dataloader(12, True), "val_dataloader": dataloader(6, False),
        "train_cfg": dict(by_epoch=True, max_epochs=2, val_interval=2), **overrides})


_TEST_SPLIT = dict(test_dataloader=dict(dataset=dict(type="AugmentedParityData", n=6),
                                        batch_size=3, num_workers=2,
                                        sampler=dict(type="DefaultSampler", shuffle=False)),
                   test_cfg=dict(), test_evaluator=dict(type="ScriptedMetric"))


@pytest.mark.parametrize("loader, overrides", [
    (dict(num_workers=0), {}),
    (dict(num_workers=2), {}),
    (dict(num_workers=2, persistent_workers=True), {}),
    # samplers draw their seed from numpy; the test split (never built by
    # MMEngine's training) must not draw
    (dict(num_workers=2), dict(randomness=dict(seed=7, diff_rank_seed=True), **_TEST_SPLIT)),
    # 10 iterations: two and a half passes, each starting its own iterator
    (dict(num_workers=2), dict(train_cfg=dict(by_epoch=False, max_iters=10, val_interval=10))),
], ids=["no-workers", "two-workers", "persistent-workers", "diff-rank-seed", "iteration-loop"])
def test_random_training_draws_what_mmengine_draws(compare, loader, overrides):
    run = compare(_random_cfg(loader, **overrides))
    assert len(run["losses"]) == (10 if "train_cfg" in overrides else 8)
    assert len({tuple(x.flatten().tolist()) for x in run["data"]}) == len(run["data"])


@DATASETS.register_module(force=True)
class WorkerSeeds(torch.utils.data.Dataset):
    """Each sample is the seed its worker's torch RNG was last given."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


@pytest.mark.parametrize("diff_rank_seed, runner_seed", [(False, 5), (True, 5 + 1)])
def test_workers_are_seeded_as_mmengine_seeds_them_on_every_rank(diff_rank_seed, runner_seed):
    """MMEngine's default_worker_init_fn: runner.seed + num_workers * rank + worker_id,
    in every epoch; runner.seed is seed + rank under diff_rank_seed."""
    from flexgraph.training.components import build_dataloader, epoch_batches
    from flexgraph.training.runtime import Env

    env = Env(rank=1, world_size=2, seed=5, diff_rank_seed=diff_rank_seed)
    loader = build_dataloader(dict(dataset=dict(type="WorkerSeeds"), batch_size=1, num_workers=2,
                                   sampler=dict(type="DefaultSampler", shuffle=False)), env)
    first = runner_seed + 2 * 1
    for epoch in (0, 1):
        seeds = [int(batch) for batch in epoch_batches(loader, epoch)]
        assert seeds == [first, first + 1, first, first + 1]


def _draws_to_start(loader: Any, epoch: int) -> int:
    """How many numbers pass ``epoch`` over ``loader`` drew from the global torch RNG."""
    from flexgraph.training.components import epoch_batches

    torch.manual_seed(0)
    for _ in epoch_batches(loader, epoch):
        pass
    after = torch.get_rng_state()
    torch.manual_seed(0)
    for drawn in range(3):
        if torch.equal(torch.get_rng_state(), after):
            return drawn
        torch.empty((), dtype=torch.int64).random_()  # what a new iterator draws
    raise AssertionError("the pass drew more than a new iterator does")


@pytest.mark.parametrize("persistent, uninterrupted, resumed", [
    (False, [1, 1, 1], [1, 1]),
    (True, [1, 0, 0], [0, 0]),  # one iterator, made in the first pass of the run
], ids=["workers", "persistent-workers"])
def test_a_pass_draws_from_the_global_torch_rng_where_mmengine_s_loop_does(
        persistent, uninterrupted, resumed):
    """MMEngine's loaders have no generator: each new iterator draws its workers'
    base seed from the global torch RNG. Persistent workers keep one iterator,
    so only the run's first pass draws; a run resumed at epoch 1 must not draw
    there either, or its training stream would be one number off."""
    from flexgraph.training.components import build_dataloader
    from flexgraph.training.runtime import Env

    def loader() -> Any:
        return build_dataloader(dict(dataset=dict(type="ParityData"), batch_size=3, num_workers=1,
                                     persistent_workers=persistent,
                                     sampler=dict(type="DefaultSampler", shuffle=True)), Env())

    run = loader()
    assert [_draws_to_start(run, epoch) for epoch in (0, 1, 2)] == uninterrupted
    run = loader()
    assert [_draws_to_start(run, epoch) for epoch in (1, 2)] == resumed


# -- a batch sampler around the shuffling sampler ------------------------------------------

@DATA_SAMPLERS.register_module(force=True)
class PlainBatchSampler(torch.utils.data.Sampler):
    """Batches of its sampler's indices in order, and no ``set_epoch`` of its own.

    What MMDetection's ``AspectRatioBatchSampler`` (and torch's ``BatchSampler``)
    look like to the loop: the sampler that shuffles is their ``.sampler``, and
    nothing passes the epoch on to it.
    """

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool = False) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        whole, rest = divmod(len(self.sampler), self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)


def _batch_sampler_cfg(**overrides: Any) -> dict[str, Any]:
    """Three epochs of 4 batches, the shuffling ``DefaultSampler`` inside a batch sampler."""
    return _base_cfg(
        train_dataloader=dict(dataset=dict(type="ParityData"), batch_size=3, num_workers=0,
                              sampler=dict(type="DefaultSampler", shuffle=True),
                              batch_sampler=dict(type="PlainBatchSampler")),
        **overrides)


def _orders(run: dict[str, Any], per_epoch: int = 4) -> list[list[tuple[float, ...]]]:
    """Each epoch's samples in the order they were trained on."""
    samples = [tuple(x.tolist()) for batch in run["data"] for x in batch]
    size = per_epoch * 3
    return [samples[i:i + size] for i in range(0, len(samples), size)]


def test_each_epoch_shuffles_anew_inside_a_batch_sampler(compare):
    """The epoch reaches the ``DefaultSampler`` under the batch sampler (MMEngine's
    ``DistSamplerSeedHook`` reaches it there), so epoch 2's order is its own, and
    the one MMEngine's Runner trains on."""
    run = compare(_batch_sampler_cfg())
    orders = _orders(run)
    assert len(orders) == 3
    assert sorted(orders[0]) == sorted(orders[1]) == sorted(orders[2])
    assert orders[1] != orders[0] and orders[2] not in orders[:2]


def test_a_resumed_run_shuffles_as_the_uninterrupted_one_inside_a_batch_sampler(tmp_path):
    """Resumed from epoch 1's checkpoint, epochs 2 and 3 see the orders they saw unbroken."""
    torch.set_num_threads(1)
    whole = run_flexgraph(_batch_sampler_cfg(), tmp_path / "whole")
    resumed = run_flexgraph(
        _batch_sampler_cfg(resume=True, load_from=str(tmp_path / "whole" / "epoch_1.pth")),
        tmp_path / "resumed")
    assert len(resumed["data"]) == 8
    assert _orders(whole)[1] != _orders(whole)[0]
    assert _orders(resumed) == _orders(whole)[1:]
    assert resumed["losses"] == whole["losses"][4:]
