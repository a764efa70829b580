"""DeepSpeed ZeRO 0-3 through ``flexgraph run --nproc-per-node 2`` (gloo, CPU), against DDP.

Every stage trains the quickstart MLP (no dropout) from the same initial
weights as a DDP run, is killed mid-epoch, and resumes from its own DeepSpeed
checkpoint; the losses of the two halves together must follow DDP's. The
optimizer is torch's AdamW handed to DeepSpeed, so no C++ optimizer is built.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flexgraph.training.checkpoint_tools import describe_checkpoint
from flexgraph.training.formats import DEEPSPEED_DIRECTORY
from tests.cli.cli_helpers import (
    KILLER,
    QUICKSTART,
    ROOT,
    TWO_EPOCHS,
    TWO_EPOCHS_ITERS,
    flexgraph_run,
    launch_two,
    same_start,
    train_losses,
    write_config,
)

pytestmark = pytest.mark.slow

pytest.importorskip("deepspeed")

STAGES = (0, 1, 2, 3)
SEED = ROOT / "examples" / "seed"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """DDP once; each ZeRO stage killed after iteration 30 and resumed."""
    root = tmp_path_factory.mktemp("deepspeed")
    start = same_start(root)
    launch_two(write_config(root / "ddp", ema=True, extra=TWO_EPOCHS
                         + "strategy = dict(type='DDPStrategy')\n" + start), "ddp", root)
    resumed = {}
    for stage in STAGES:
        strategy = (f"strategy = dict(type='DeepSpeedStrategy', "
                    f"zero_optimization=dict(stage={stage}), checkpoint_format='native')\n")
        killing = write_config(root / f"killing{stage}", inspect=True, ema=True,
                               extra=TWO_EPOCHS + strategy + start, at_iter=30, rank=1)
        killed = flexgraph_run(str(killing), "--work-dir", f"zero{stage}", "--nproc-per-node",
                               "2", cwd=root)
        assert killed.returncode != 0
        plain = write_config(root / f"zero{stage}-cfg", ema=True,
                             extra=TWO_EPOCHS + strategy + start)
        resumed[stage] = launch_two(plain, f"zero{stage}", root, "--resume", "auto")
    return {"root": root, "resumed": resumed}


@pytest.mark.parametrize("stage", STAGES)
def test_every_zero_stage_trains_like_ddp_and_resumes_where_it_stopped(runs, stage):
    root = runs["root"]
    ddp, zero = train_losses(root / "ddp"), train_losses(root / f"zero{stage}")
    assert max(zero) == TWO_EPOCHS_ITERS
    assert "Resumed from" in runs["resumed"][stage].stdout + runs["resumed"][stage].stderr
    iters = sorted(zero)
    assert zero[iters[-1]] < 0.6 * zero[iters[0]], "the loss goes down"
    # fp32, same data and initial weights: DeepSpeed's bucketed reductions and
    # flattened optimizer differ from DDP's in the order of sums only.
    for it in iters:
        assert zero[it] == pytest.approx(ddp[it], rel=1e-4, abs=1e-5), (stage, it)
    saved = sorted(p.name for p in (root / f"zero{stage}").glob("iter_*.ds"))
    assert saved == ["iter_20.ds", "iter_40.ds", f"iter_{TWO_EPOCHS_ITERS}.ds"]
    # a hook's state went into DeepSpeed's client state and came back on resume
    ema = [json.loads((root / name / "ema-rank0.json").read_text())["ema_loss"]
           for name in ("ddp", f"zero{stage}")]
    assert ema[1] == pytest.approx(ema[0], rel=1e-4)
    last = json.loads((root / f"zero{stage}" / "deepspeed_config.json").read_text())
    assert last["zero_optimization"]["stage"] == stage
    assert last["train_micro_batch_size_per_gpu"] == 32 and last["train_batch_size"] == 64


@pytest.mark.parametrize("stage", (1, 3))
def test_inspect_describes_a_zero_checkpoint_as_it_describes_ddps(runs, stage):
    """Offline, without DeepSpeed's engine; ZeRO-3's partitioned weights counted whole."""
    root = runs["root"]
    ddp = describe_checkpoint(root / "ddp" / "iter_20.pth")
    zero = describe_checkpoint(root / f"zero{stage}" / "iter_20.ds")
    assert zero.format == DEEPSPEED_DIRECTORY.name
    assert zero.writer == f"flexgraph, DeepSpeed ZeRO-{stage}" and zero.complete
    assert (zero.world_size, zero.iteration) == (ddp.world_size, ddp.iteration) == (2, 20)
    assert zero.epoch == ddp.epoch
    assert (zero.parameters, zero.dtypes) == (ddp.parameters, ddp.dtypes)
    assert zero.contents == ddp.contents == ("model", "optimizer", "param_schedulers",
                                             "loop state", "rng states")
    assert zero.extras == ddp.extras == ("ema_loss",)
    assert "ds_version" in zero.versions


@pytest.mark.parametrize("stage", (1, 3))
def test_a_zero_checkpoint_converts_to_deepspeeds_own_fp32_weights(runs, tmp_path, stage):
    """torch and safetensors files equal to zero_to_fp32's eager result; a whole model's
    load_from (single device, DDP) reads the tag itself to the same tensors."""
    import sys

    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from flexgraph.training.checkpoint import Checkpointer, FileCheckpointIO
    from flexgraph.training.checkpoint_tools import convert_checkpoint
    from flexgraph.training.formats import read_any_checkpoint

    tag = runs["root"] / f"zero{stage}" / "iter_20.ds"
    expected = get_fp32_state_dict_from_zero_checkpoint(str(tag.parent), tag=tag.name)
    sys.path.insert(0, str(ROOT / "examples"))
    from digits import DigitsMLP

    model = DigitsMLP(hidden=128, dropout=0.0)
    assert not Checkpointer(tmp_path, io=FileCheckpointIO()).load_weights(
        tag, model, on_read=lambda checkpoint: None)
    for target in ("torch", "safetensors"):
        done = convert_checkpoint(tag, tmp_path / target, to=target)
        assert done.left_out and done.left_out[0].startswith("optimizer: DeepSpeed's own")
        assert describe_checkpoint(tmp_path / target).parameters == \
            describe_checkpoint(tag).parameters
        for weights in (read_any_checkpoint(tmp_path / target)["state_dict"], model.state_dict()):
            assert sorted(weights) == sorted(expected)
            for key, value in expected.items():
                assert torch.equal(weights[key], value), (stage, target, key)


def test_a_zero3_checkpoint_seeds_ddp_and_its_exports_seed_fsdp_and_zero1(runs, tmp_path):
    """load_from under other strategies, the reader named in the log; the same accuracy."""
    from flexgraph.training.checkpoint_tools import convert_checkpoint

    tag = runs["root"] / "zero3" / "iter_20.ds"
    exported, sharded = tmp_path / "exported.weights", tmp_path / "exported.dcp"
    convert_checkpoint(tag, exported, to="safetensors")
    convert_checkpoint(tag, sharded, to="dcp")
    fsdp = write_config(tmp_path / "fsdp", extra="strategy = dict(type='FSDPStrategy')\n")
    results = []
    for config, path, reader in (
            (runs["root"] / "ddp" / "cfg.py", tag, "a DeepSpeed checkpoint directory"),
            (fsdp, exported, "a safetensors file"),
            (runs["root"] / "zero1-cfg" / "cfg.py", sharded,
             "a torch.distributed.checkpoint directory")):
        done = launch_two(config, f"seeded-{config.parent.name}", tmp_path, "--entry", "val",
                          "--load-from", str(path))
        out = done.stdout + done.stderr
        assert f"Loaded weights from {path} (read as {reader}" in out, out[-3000:]
        results.append([x for x in done.stdout.splitlines() if x.startswith("val_result:")])
    assert results[0] and results[0] == results[1] == results[2]


def test_zero3_partitions_the_model_on_every_rank(runs):
    work = runs["root"] / "zero3"
    for rank in range(2):
        info = json.loads((work / f"inspect-rank{rank}.json").read_text())
        assert info["model"] == "EngineModel" and info["optim_wrapper"] == "DeepSpeedOptimWrapper"
        assert info["local_numel"] * 2 <= info["numel"] + 256, "each rank holds its partition"
    bucket = json.loads((work / "deepspeed_config.json").read_text())["zero_optimization"]
    assert bucket["reduce_bucket_size"] == bucket["stage3_prefetch_bucket_size"] == 1_000_000


def _saved_checkpoints(work_dir: Path) -> list[str]:
    """Every checkpoint a run left in its work_dir, in any format (``epoch_1.ckpt``,
    ``iter_20.ds``, ...), and the ``last_checkpoint`` pointer a save writes."""
    if not work_dir.exists():
        return []
    return sorted(p.name for p in work_dir.iterdir()
                  if p.name == "last_checkpoint" or p.name.startswith(("epoch_", "iter_")))


def _cpu_has_fp16() -> bool:
    """What DeepSpeed's CPU accelerator asks (oneDNN's fp16: AVX512-FP16 or AMX-FP16)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())


def test_one_process_trains_without_a_launcher(tmp_path):
    """A process started without a launcher (no LOCAL_RANK, which DeepSpeed reads itself)
    is a world of one."""
    config = write_config(tmp_path / "one", extra="strategy = dict(type='DeepSpeedStrategy', "
                                                  "zero_optimization=dict(stage=1))\n"
                                                  "train_cfg = dict(by_epoch=False, max_iters=3)\n")
    done = flexgraph_run(str(config), "--work-dir", "one", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(train_losses(tmp_path / "one")) == [1, 2, 3]


def test_an_amp_config_trains_in_deepspeed_s_bf16_and_says_so(tmp_path):
    """MMEngine's AMP settings become DeepSpeed's precision section, logged; a change of
    wrapper type from the command line drops the keys it does not take, with a warning."""
    config = write_config(tmp_path / "amp", extra=(
        "strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=1))\n"
        "train_cfg = dict(by_epoch=False, max_iters=3)\n"
        "optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')\n"))
    done = flexgraph_run(str(config), "--work-dir", "amp", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads((tmp_path / "amp" / "deepspeed_config.json").read_text())
    assert written["bf16"] == {"enabled": True} and "fp16" not in written
    assert "filled in: bf16={'enabled': True}" in done.stdout + done.stderr
    done = flexgraph_run(str(config), "--work-dir", "changed", "--cfg-options",
                         "optim_wrapper.type=DeepSpeedOptimWrapper",
                         "optim_wrapper.loss_scale=dynamic", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "optim_wrapper.dtype, optim_wrapper.loss_scale: dropped" in done.stderr
    assert "bf16" not in json.loads((tmp_path / "changed" / "deepspeed_config.json")
                                    .read_text())


def _run_seed_fp16(tmp_path: Path):
    return flexgraph_run(str(SEED / "deepspeed_zero3_fp16.py"), "--work-dir", "work",
                         "--nproc-per-node", "2", "--cfg-options", "train_cfg.max_epochs=1",
                         cwd=tmp_path)


def test_fp16_on_a_cpu_without_it_stops_at_once_with_the_bf16_way_out(tmp_path, monkeypatch):
    """Capped below oneDNN's fp16 instructions, this CPU lacks fp16 as most do, whatever
    CPU the test lands on (``ONEDNN_MAX_CPU_ISA`` is oneDNN's own cap, which DeepSpeed's
    CPU accelerator asks through torch)."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    done = _run_seed_fp16(tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bf16=dict(enabled=True)" in errors[0], done.stderr[-2000:]
    assert "step 'setup_env'" in errors[0], "stopped before the process group was joined"
    assert _saved_checkpoints(tmp_path / "work") == [], "nothing was trained or saved"


@pytest.mark.skipif(not _cpu_has_fp16(), reason="this CPU has no fp16 (AVX512-FP16 or AMX-FP16)")
def test_fp16_on_a_cpu_with_it_trains_as_on_a_gpu(tmp_path):
    done = _run_seed_fp16(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "work" / "deepspeed_config.json").read_text())["fp16"]["enabled"]
    assert _saved_checkpoints(tmp_path / "work") == ["epoch_1.ckpt", "last_checkpoint"]


def test_the_seed_zero3_config_in_bf16_trains_on_the_cpu(tmp_path, monkeypatch):
    extensions = tmp_path / "torch_extensions"  # where DeepSpeed would build its C++ ops
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    (tmp_path / "killer.py").write_text(KILLER)
    config = tmp_path / "seed_cfg.py"
    config.write_text(
        f"_base_ = [{str(SEED / 'deepspeed_zero3_bf16.py')!r}]\n"
        "custom_imports = dict(imports=['digits', 'digits_vit', 'killer'],\n"
        "                      allow_failed_imports=False)\n"
        "model = dict(dim=32, depth=2)\n"
        "train_cfg = dict(max_epochs=2, val_interval=2)\n"
        "default_hooks = dict(logger=dict(type='LoggerHook', interval=5))\n"
        "custom_hooks = [dict(type='Inspect')]\n")
    launch_two(config, "seed", tmp_path)
    losses = train_losses(tmp_path / "seed")
    assert losses[max(losses)] < losses[min(losses)]
    info = json.loads((tmp_path / "seed" / "inspect-rank0.json").read_text())
    assert info["compute_dtype"] == "torch.bfloat16", "inputs_to_half casts to bf16"
    assert not list(extensions.glob("*shm*")), "no shared-memory all-reduce was compiled"


ENCODER = '''
"""A tiny classifier on torch's TransformerEncoder, which deep-copies its layer."""
import torch
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from torch import nn


@MODELS.register_module(force=True)
class TinyEncoder(BaseModel):
    def __init__(self, dim=16):
        super().__init__()
        self.embed = nn.Linear(64, dim)
        layer = nn.TransformerEncoderLayer(dim, 2, dim_feedforward=32, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, inputs, labels=None, mode="tensor"):
        tokens = self.embed(torch.stack(inputs)).unsqueeze(1)
        logits = self.head(self.encoder(tokens).squeeze(1))
        return {"loss": nn.functional.cross_entropy(logits, torch.stack(labels))}
'''


def test_zero3_refuses_a_transformer_encoder_before_training_naming_its_parameters(tmp_path):
    (tmp_path / "tiny_encoder.py").write_text(ENCODER)
    config = tmp_path / "cfg.py"
    config.write_text(
        f"_base_ = [{str(QUICKSTART)!r}]\n"
        "custom_imports = dict(imports=['digits', 'tiny_encoder'], allow_failed_imports=False)\n"
        "model = dict(_delete_=True, type='TinyEncoder')\n"
        "strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3))\n")
    done = flexgraph_run(str(config), "--work-dir", "work", "--nproc-per-node", "2",
                         cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    # refused right after the model is built under zero.Init: before the engine, the load
    # and training
    assert "step 'build_model' broke contract 'partitioned'" in errors[0]
    for words in ("'encoder.layers.0.self_attn.in_proj_weight'", "'encoder' (TransformerEncoder)",
                  "nn.ModuleList", "zero_optimization.stage 1 or 2", "FSDPStrategy"):
        assert words in errors[0], words
    assert _saved_checkpoints(tmp_path / "work") == [], "nothing was trained or saved"
