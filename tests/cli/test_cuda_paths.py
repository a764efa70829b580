"""Paths that need CUDA: NCCL, mixed precision on the GPU, CPU offload, DeepSpeed fp16.

They run with one process per visible GPU and skip on machines without one
(the CPU suite covers the same code with gloo, bf16 and fp32).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.cli.cli_helpers import flexgraph_run, write_config

GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device")]

SHORT = """
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(logger=dict(type='LoggerHook', interval=5))
"""


def _run(tmp_path, strategy: str, *extra_cfg: str):
    config = write_config(tmp_path / "cfg", inspect=True, extra=SHORT + strategy
                          + "".join(extra_cfg))
    done = flexgraph_run(str(config), "--work-dir", "work", "--nproc-per-node", str(GPUS),
                         cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "work" / "inspect-rank0.json").read_text())


def test_ddp_on_nccl_with_amp(tmp_path):
    info = _run(tmp_path, "strategy = dict(type='DDPStrategy')\n",
                "optim_wrapper = dict(type='AmpOptimWrapper')\n")
    assert info["backend"] == "nccl" and info["optim_wrapper"] == "AmpOptimWrapper"


def test_fsdp_with_bf16_parameters_and_cpu_offload(tmp_path):
    info = _run(tmp_path, "strategy = dict(type='FSDPStrategy', model_wrapper=dict("
                "mixed_precision=dict(param_dtype='bfloat16'), cpu_offload=True))\n")
    assert info["backend"] == "nccl" and info["param_dtype"] == "torch.bfloat16"


def test_deepspeed_zero3_fp16_with_loss_scaling(tmp_path):
    pytest.importorskip("deepspeed")
    info = _run(tmp_path, "strategy = dict(type='DeepSpeedStrategy', "
                "fp16=dict(enabled=True, loss_scale=0, initial_scale_power=15), "
                "inputs_to_half=['inputs'], zero_optimization=dict(stage=3, "
                "offload_optimizer=dict(device='cpu')))\n")
    assert info["compute_dtype"] == "torch.float16"
