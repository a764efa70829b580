"""What both runners of the MMDetection tests run: a probe, and MMEngine's side.

Imported through ``custom_imports=dict(imports=['mmdet_parts'])`` by ``flexgraph
run`` and by MMEngine's ``Runner`` alike (this folder on PYTHONPATH), so both
record through the same hook. Run as a script under ``torch.distributed.run``,
it is MMEngine's side of the tests: what MMDetection's ``tools/train.py
--launcher pytorch`` does, on CPU processes::

    python -m torch.distributed.run --nproc-per-node 2 mmdet_parts.py CONFIG WORK_DIR \\
        --cfg-options KEY=VALUE ...

Two things in the Runner assume GPUs, and are changed here, not in the
config: ``init_dist`` calls ``torch.cuda.set_device(LOCAL_RANK)``, which a
machine without one refuses, and the Runner wraps the model in
``MMDistributedDataParallel(device_ids=[LOCAL_RANK])``, which DDP refuses for a
CPU module. The wrapper is built from ``model_wrapper_cfg`` instead, with the
Runner's own defaults (``broadcast_buffers=False``, the config's
``find_unused_parameters``) and ``device_ids=None``. (MMEngine reads its own
checkpoints only with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` under current torch.)
"""

from __future__ import annotations

import json
import os

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _bare(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside whatever wraps it (DDP, a DeepSpeed engine: ``.module``)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


@HOOKS.register_module(force=True)
class DetectionProbe(Hook):
    """Writes ``probe/`` in the work dir, the same way under either runner.

    ``losses-rank{R}.json``: every iteration's raw losses on rank R, as floats
    (the Runner's LoggerHook logs window means, flexgraph's metrics the last
    value: neither is the raw stream). ``metrics.json``: each evaluation's
    metrics, with its epoch. ``trainable.json``: which parameters train
    (``requires_grad``) as training starts. VERY_HIGH, so that it records each
    iteration before any other hook acts on it.
    """

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self.losses: list[dict[str, float]] = []
        self.metrics: list[dict[str, float]] = []

    def before_train(self, runner) -> None:
        trainable = {name: param.requires_grad
                     for name, param in _bare(runner.model).named_parameters()}
        if runner.rank == 0:
            self._write(runner, "trainable.json", trainable)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.losses.append({key: float(value) for key, value in (outputs or {}).items()})

    def after_train_epoch(self, runner) -> None:
        self._write(runner, f"losses-rank{runner.rank}.json", self.losses)

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.metrics.append({"epoch": runner.epoch, **{k: float(v) for k, v in
                                                        (metrics or {}).items()}})
        if runner.rank == 0:
            self._write(runner, "metrics.json", self.metrics)

    @staticmethod
    def _write(runner, name: str, value: object) -> None:
        folder = os.path.join(runner.work_dir, "probe")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
            json.dump(value, f)


class _Boundary(torch.autograd.Function):
    """An identity with a node of its own in the graph, as ZeRO-3 puts at a module's edge."""

    @staticmethod
    def forward(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, *grads):
        return grads


@HOOKS.register_module(force=True)
class ZeroThreeBoundaries(Hook):
    """DDP with the graph ZeRO-3 trains through: an identity autograd function on every
    tensor a module takes and every tensor it returns.

    DeepSpeed's ZeRO-3 puts them there (``PostBackwardFunctionModule`` on a module's
    inputs, ``PreBackwardFunctionForModule`` on its outputs, in
    ``deepspeed/runtime/zero/parameter_offload.py``) to know when a module's backward
    starts and ends, which is when it gathers and releases its parameters. They
    change no value, but they change how gradients add up: a tensor that three
    consumers read across a module's edge (ResNet's stage output: the next
    stage's first conv, its downsample, and the FPN's lateral conv) gets their
    gradients summed in another grouping, ``(a + b) + c`` against ``a + (b + c)``,
    one rounding apart. With these boundaries DDP's arithmetic is ZeRO-3's to the
    bit, which makes everything else ZeRO-3 does comparable with DDP exactly.
    """

    priority = "VERY_HIGH"

    def before_train(self, runner) -> None:
        # DeepSpeed's own walk over a module's inputs and outputs (tuples, lists, dicts)
        from deepspeed.runtime.zero.utils import apply_to_tensors_only

        for module in _bare(runner.model).modules():
            module.register_forward_pre_hook(
                lambda _, args: apply_to_tensors_only(_Boundary.apply, args))
            module.register_forward_hook(
                lambda _, args, output: apply_to_tensors_only(_Boundary.apply, output))


def _no_cuda_device(local_rank: int) -> None:
    """``torch.cuda.set_device`` on a machine without CUDA devices: nothing to select."""


def main() -> None:
    """Train CONFIG with MMEngine's Runner into WORK_DIR, on this rank's CPU process."""
    from mmengine.runner import Runner
    from mmengine_parity_parts import end_runner_rank, runner_config

    cfg = runner_config()
    cfg.launcher = "pytorch"
    if not torch.cuda.is_available():
        torch.cuda.set_device = _no_cuda_device
        cfg.model_wrapper_cfg = dict(
            type="MMDistributedDataParallel", device_ids=None, broadcast_buffers=False,
            find_unused_parameters=cfg.get("find_unused_parameters", False))
    Runner.from_cfg(cfg).train()
    end_runner_rank()


if __name__ == "__main__":
    main()
