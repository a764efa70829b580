"""Behaviour parity with MMEngine's ``Runner``, checked against the Runner itself.

Each case runs one config twice, under MMEngine's ``Runner`` (on the CPU:
``launcher='none'``, gloo) and under flexgraph (the standard graph, as
``flexgraph run`` plans it), and compares what a user can observe: every hook
call with ``runner.epoch`` / ``runner.iter`` / ``batch_idx`` and the learning
rate the hook sees, the data each iteration trains on, the checkpoint meta
``before_save_checkpoint`` sees, the checkpoints left in ``work_dir``, the
train log lines, and the final weights, bit for bit (the arithmetic is the
same: a step-API model trained through MMEngine's own ``train_step`` and
optimizer wrappers). The configs follow MMEngine's runner tests: the toy
model, dataset and metric, an epoch and an iteration loop, ``save_best``,
hooks at LOW priority, the logger's interval, and a GAN with two optimizers.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseDataPreprocessor, BaseModel
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapperDict
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn
from training_helpers import run_steps

from flexgraph.training.errors import UnusedConfigWarning

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

    def __init__(self, name: str) -> None:
        self.name = name

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._record("before_train_iter", runner, batch_idx=batch_idx)
        if self.name == "normal":
            ParityRecorder.DATA.append(torch.stack(data_batch["inputs"]).clone())

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
        "log_lines": list(TrainLogCapture.LINES),
        "checkpoints": [re.sub(r"-[0-9a-f]{8}\.pth$", "-<sha>.pth", f) for f in files],
        "last_checkpoint": Path(pointer.read_text().strip()).name if pointer.exists() else None,
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def _reset() -> None:
    ParityRecorder.LOG, ParityRecorder.DATA, TrainLogCapture.LINES = [], [], []


def run_mmengine(cfg: dict[str, Any], work_dir: Path, monkeypatch) -> dict[str, Any]:
    from mmengine.runner import Runner, loops

    _reset()
    with monkeypatch.context() as patch:
        # Its iteration loop sleeps 2 s at each pass over the data ("prevent possible
        # deadlock" with workers); there are none here.
        patch.setattr(loops.time, "sleep", lambda seconds: None)
        # MMEngine reads its own checkpoints (published_keys) with torch.load's
        # default, which refuses the objects it writes under current torch.
        patch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
        runner = Runner.from_cfg(Config(dict(cfg, work_dir=str(work_dir))))
        runner.train()
    return _observed(work_dir, runner.model)


def run_flexgraph(cfg: dict[str, Any], work_dir: Path) -> dict[str, Any]:
    _reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedConfigWarning)  # every key here is acted on
        context = run_steps(Config(dict(cfg, work_dir=str(work_dir))),
                            setup_env={"device": "cpu"})
    return _observed(work_dir, context["model"])


def assert_same_run(mm: dict[str, Any], fg: dict[str, Any]) -> None:
    for key in ("checkpoints", "last_checkpoint", "log_lines"):
        assert fg[key] == mm[key], key
    assert len(fg["hooks"]) == len(mm["hooks"])
    for i, (a, b) in enumerate(zip(mm["hooks"], fg["hooks"], strict=True)):
        assert b == a, f"hook call {i}: MMEngine {a}, flexgraph {b}"
    assert len(fg["data"]) == len(mm["data"])
    assert all(torch.equal(a, b) for a, b in zip(mm["data"], fg["data"], strict=True))
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
        return fg

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
