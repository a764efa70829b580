"""Plain nn.Module models: batches, dict losses, loops, evaluation, accumulation."""

from __future__ import annotations

import json

import pytest
import torch
from mmengine.evaluator import BaseMetric
from mmengine.optim import OptimWrapper
from mmengine.registry import METRICS, OPTIM_WRAPPERS

from tests.training.training_helpers import run_steps


def _records(work):
    return [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]


def test_iteration_loop_with_dict_batches_and_dict_losses(tmp_path, make_cfg):
    cfg = make_cfg(
        model=dict(type="ToyNet", dict_loss=True),
        train_dataloader=dict(batch_size=4, dataset=dict(type="ToyDataset", as_dict=True),
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        val_dataloader=dict(batch_size=10, dataset=dict(type="ToyDataset", n=20, as_dict=True)),
        train_cfg=dict(by_epoch=False, max_iters=25, val_interval=10),
        param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=10)],
    )
    result = run_steps(cfg)["train_result"]
    # 25 iterations are 2.5 passes over the data; to hooks (MMEngine) it is one epoch, index 0
    assert result["iter"] == 25 and result["epoch"] == 0
    assert {"loss", "loss_ce", "loss_l2", "acc", "lr", "val/loss"} <= set(result)
    records = _records(tmp_path / "work")
    train = [r for r in records if "mode" not in r]
    assert [r["iter"] for r in train] == list(range(1, 26))
    assert [r["epoch"] for r in train] == [1] * 10 + [2] * 10 + [3] * 5
    first = train[0]
    assert first["loss"] == pytest.approx(first["loss_ce"] + first["loss_l2"])
    assert train[0]["lr"] == pytest.approx(0.001) and train[-1]["lr"] == pytest.approx(0.01)
    assert [r["iter"] for r in records if r.get("mode") == "val"] == [10, 20, 25]


def test_accumulation_and_clipping_go_through_the_optim_wrapper(make_cfg):
    cfg = make_cfg(optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1),
                                      accumulative_counts=2, clip_grad=dict(max_norm=0.5)),
                   param_scheduler=None)
    ctx = run_steps(cfg)
    ow = ctx["optim_wrapper"]
    assert ow.inner_count == 30
    assert ctx["hooks"].runner.message_hub.get_scalar("train/grad_norm") is not None


def test_the_optim_wrappers_own_update_still_counts_and_steps(make_cfg):
    # MMEngine's OptimWrapper unclipped: its backward/step/zero_grad written out
    ctx = run_steps(make_cfg(param_scheduler=None))
    assert ctx["optim_wrapper"].inner_count == ctx["train_result"]["iter"] == 30

    @OPTIM_WRAPPERS.register_module(force=True)
    class CountingOptimWrapper(OptimWrapper):
        steps = 0

        def step(self, **kwargs):
            type(self).steps += 1
            super().step(**kwargs)

    # a wrapper with a step of its own: its step is called, every iteration
    ctx = run_steps(make_cfg(optim_wrapper=dict(type="CountingOptimWrapper",
                                                optimizer=dict(type="SGD", lr=0.1)),
                             param_scheduler=None))
    assert CountingOptimWrapper.steps == ctx["optim_wrapper"].inner_count == 30


@METRICS.register_module(force=True)
class ToyLossMetric(BaseMetric):
    default_prefix = "toy"

    def process(self, data_batch, data_samples):
        self.results.extend(float(s.detach()) for s in data_samples)

    def compute_metrics(self, results):
        return {"mean_output": sum(results) / len(results)}


def test_val_and_test_entry_points(tmp_path, make_cfg):
    train_ctx = run_steps(make_cfg(default_hooks=dict(checkpoint=dict(interval=1))))
    ckpt = str(tmp_path / "work" / "epoch_3.pth")
    val = run_steps(make_cfg(load_from=ckpt), last="val")["val_result"]
    assert val["loss"] == pytest.approx(train_ctx["train_result"]["val/loss"])

    test_dl = dict(batch_size=5, dataset=dict(type="ToyDataset", n=20, seed=2))
    cfg = make_cfg(load_from=ckpt, test_dataloader=test_dl,
                   test_evaluator=dict(type="ToyLossMetric"))
    result = run_steps(cfg, last="test")["test_result"]
    assert set(result) == {"toy/mean_output"}
    assert [r["mode"] for r in _records(tmp_path / "work") if "mode" in r][-2:] == ["val", "test"]


def test_compile_step_keeps_the_model_usable(make_cfg):
    cfg = make_cfg(train_cfg=dict(by_epoch=False, max_iters=3), param_scheduler=None,
                   val_dataloader=None)
    ctx = run_steps(cfg, include=("compile",), compile={"options": {"backend": "eager"}})
    model = ctx["model"]
    assert model._compiled_call_impl is not None  # compiled in place, type unchanged
    assert set(model.state_dict()) == {"body.0.weight", "body.0.bias", "head.weight",
                                       "head.bias"}
    assert ctx["train_result"]["iter"] == 3
    assert torch.isfinite(torch.tensor(ctx["train_result"]["loss"]))


def test_iterable_dataset_in_an_iteration_loop(make_cfg):
    stream = dict(batch_size=4, dataset=dict(type="ToyStream"))
    cfg = make_cfg(train_dataloader=stream, val_dataloader=None, param_scheduler=None,
                   train_cfg=dict(by_epoch=False, max_iters=23))
    assert run_steps(cfg)["train_result"]["iter"] == 23


def test_an_iterable_dataset_that_yields_nothing_fails_clearly(make_cfg):
    from flexgraph.training.errors import EmptyDatasetError

    stream = dict(batch_size=4, dataset=dict(type="ToyStream", n=0))
    cfg = make_cfg(train_dataloader=stream, val_dataloader=None, param_scheduler=None,
                   train_cfg=dict(by_epoch=False, max_iters=5))
    with pytest.raises(EmptyDatasetError, match="yielded no batch in epoch 1"):
        run_steps(cfg)
