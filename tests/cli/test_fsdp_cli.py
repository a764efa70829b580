"""FSDP2 through ``flexgraph run --nproc-per-node 2`` (gloo), checked against DDP.

One set of runs serves several specifications (each run costs seconds of
process start-up): the quickstart MLP without dropout, started from the same
initial weights under DDP and under FSDP, two epochs. Then FSDP is killed
mid-epoch and resumed, stopped by SIGTERM and resumed past a damaged
checkpoint, and a DDP checkpoint is evaluated under FSDP.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.cli.cli_helpers import (
    KILLER,
    ROOT,
    TWO_EPOCHS,
    TWO_EPOCHS_ITERS,
    final_state,
    flexgraph_run,
    launch_two,
    same_start,
    train_losses,
    write_config,
)

pytestmark = pytest.mark.slow

DDP = """
strategy = dict(type='DDPStrategy',
                model_wrapper=dict(find_unused_parameters=True, broadcast_buffers=False))
"""
FSDP = """
strategy = dict(
    type='FSDPStrategy',
    model_wrapper=dict(
        auto_wrap_policy=dict(type='torch.distributed.fsdp.wrap.size_based_auto_wrap_policy',
                              min_num_params=5000),
        sharding_strategy='SHARD_GRAD_OP',
        mixed_precision=dict(param_dtype='float32', reduce_dtype='float32')),
    checkpoint_format='native')
"""


# SIGTERM to the launcher after 21 iterations; the ranks agree every 4: stop at 24
TERM = """
custom_hooks = [dict(type='SignalAt', at_iter=21, rank=1)]
preemption = dict(check_interval=4)
"""


def _plant_a_truncated_newer_checkpoint(work: Path) -> Path:
    """A copy of the latest sharded checkpoint under a newer name, a shard cut short."""
    latest = Path((work / "last_checkpoint").read_text().strip())
    damaged = work / "iter_25.dcp"
    shutil.copytree(latest, damaged)
    shard = damaged / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    (work / "last_checkpoint").write_text(str(damaged))
    return damaged


def _inspected(work_dir: Path) -> list[dict]:
    return [json.loads((work_dir / f"inspect-rank{r}.json").read_text()) for r in range(2)]


def _dcp_tensors(path: Path) -> dict:
    """Every tensor of a sharded checkpoint, gathered into one dict (test-side only)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = path.parent / (path.name + ".pt")
    dcp_to_torch_save(path, flat)
    return torch.load(flat, weights_only=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """DDP and FSDP from the same initial weights; FSDP killed and resumed."""
    root = tmp_path_factory.mktemp("fsdp")
    start = same_start(root)
    ddp = write_config(root / "ddp", inspect=True, extra=TWO_EPOCHS + DDP + start)
    fsdp = write_config(root / "fsdp", inspect=True, extra=TWO_EPOCHS + FSDP + start)
    killing = write_config(root / "killing", extra=TWO_EPOCHS + FSDP + start, at_iter=30, rank=1)
    stopping = write_config(root / "stopping", extra=TWO_EPOCHS + FSDP + start + TERM)
    launch_two(ddp, "ddp", root)
    fsdp_done = launch_two(fsdp, "fsdp", root)
    killed = flexgraph_run(str(killing), "--work-dir", "cut", "--nproc-per-node", "2", cwd=root)
    assert killed.returncode != 0
    resumed = launch_two(fsdp, "cut", root, "--resume", "auto")
    stopped = flexgraph_run(str(stopping), "--work-dir", "stop", "--nproc-per-node", "2",
                            cwd=root)
    damaged = _plant_a_truncated_newer_checkpoint(root / "stop")
    after_stop = launch_two(fsdp, "stop", root, "--resume", "auto")
    return {"root": root, "fsdp_stdout": fsdp_done.stdout, "killed": killed,
            "resumed": resumed, "stopped": stopped, "damaged": damaged,
            "after_stop": after_stop}


def test_fsdp_loss_goes_down_and_agrees_with_ddp(runs):
    ddp, fsdp = train_losses(runs["root"] / "ddp"), train_losses(runs["root"] / "fsdp")
    assert sorted(ddp) == sorted(fsdp) and max(fsdp) == TWO_EPOCHS_ITERS
    iters = sorted(fsdp)
    assert fsdp[iters[-1]] < 0.6 * fsdp[iters[0]], "FSDP training lowers the loss"
    # Same data, same initial weights, fp32: only the order of the gradient
    # reductions differs (reduce-scatter vs all-reduce), so losses agree closely.
    for it in iters:
        assert fsdp[it] == pytest.approx(ddp[it], rel=1e-4, abs=1e-5), it


def test_each_rank_trains_with_the_options_the_config_gave(runs):
    for rank, info in enumerate(_inspected(runs["root"] / "fsdp")):
        assert info["backend"] == "gloo" and info["world_size"] == 2, rank
        assert info["fsdp_units"] == ["", "net.0"], "the size policy picked net.0, then root"
        assert info["param_types"] == ["DTensor"]
        assert info["local_numel"] * 2 <= info["numel"] + 256, "each rank holds half"
        assert info["reshard_after_forward"] is False, "SHARD_GRAD_OP"
        assert info["param_dtype"] == info["reduce_dtype"] == "torch.float32"
    for rank, info in enumerate(_inspected(runs["root"] / "ddp")):
        assert info["model"] == "MMDistributedDataParallel", rank
        assert info["find_unused_parameters"] is True and info["broadcast_buffers"] is False


def test_fsdp_saves_sharded_checkpoints_every_rank_writes(runs):
    work = runs["root"] / "fsdp"
    last = Path((work / "last_checkpoint").read_text().strip())
    assert last.name == f"iter_{TWO_EPOCHS_ITERS}.dcp" and last.is_dir()
    assert sorted(p.name for p in last.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    extra = torch.load(last / "extra.pth", weights_only=True)
    assert extra["meta"]["iter"] == TWO_EPOCHS_ITERS and len(extra["rng_states"]) == 2
    assert sorted(p.name for p in work.glob("iter_*")) == [
        "iter_20.dcp", "iter_40.dcp", f"iter_{TWO_EPOCHS_ITERS}.dcp"]


def test_a_killed_fsdp_run_resumes_at_the_right_iteration_bit_identical(runs):
    root = runs["root"]
    assert "Resumed from" in runs["resumed"].stdout + runs["resumed"].stderr
    resumed_at = torch.load(root / "cut" / "iter_20.dcp" / "extra.pth",
                            weights_only=True)["meta"]
    assert resumed_at["iter"] == 20 and resumed_at["batch_idx"] == 20
    full = _dcp_tensors(root / "fsdp" / f"iter_{TWO_EPOCHS_ITERS}.dcp")
    cut = _dcp_tensors(root / "cut" / f"iter_{TWO_EPOCHS_ITERS}.dcp")
    assert sorted(full["state_dict"]) == sorted(cut["state_dict"])
    for key, value in full["state_dict"].items():
        assert torch.equal(value, cut["state_dict"][key]), key
    for name, state in full["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value),
                               torch.as_tensor(cut["optimizer"]["state"][name][key])), name


def test_a_full_ddp_checkpoint_loads_into_the_shards(runs):
    root = runs["root"]
    trained = final_state(root / "ddp")
    reported = [json.loads(x) for x in (root / "ddp" / "metrics.jsonl").read_text().splitlines()]
    accuracy = [x for x in reported if x.get("mode") == "val"][-1]["accuracy/top1"]
    checkpoint = Path((root / "ddp" / "last_checkpoint").read_text().strip())
    assert trained["meta"]["iter"] == TWO_EPOCHS_ITERS
    config = root / "fsdp" / "cfg.py"
    done = launch_two(config, "eval", root, "--entry", "val", "--load-from", str(checkpoint))
    assert f"val_result: {{'accuracy/top1': {accuracy}}}" in done.stdout


def test_mmpretrain_style_fsdp_config_trains_on_the_cpu(tmp_path):
    """examples/vit_fsdp.py: a size-based auto-wrap policy and AmpOptimWrapper, unchanged."""
    (tmp_path / "killer.py").write_text(KILLER)
    config = tmp_path / "vit_cfg.py"
    config.write_text(
        f"_base_ = [{str(ROOT / 'examples' / 'vit_fsdp.py')!r}]\n"
        "custom_imports = dict(imports=['digits', 'digits_vit', 'killer'],\n"
        "                      allow_failed_imports=False)\n"
        "model = dict(dim=32, depth=2)\n"
        "train_cfg = dict(max_epochs=2, val_interval=2)\n"
        "custom_hooks = [dict(type='Inspect')]\n")
    launch_two(config, "vit", tmp_path)
    losses = train_losses(tmp_path / "vit")
    assert losses[max(losses)] < losses[min(losses)]
    for info in _inspected(tmp_path / "vit"):
        assert info["optim_wrapper"] == "CPUAmpOptimWrapper"
        # each block (~12.7k parameters) is over the policy's 1e4; the embedding is not
        assert info["fsdp_units"] == ["", "blocks.0", "blocks.1"]


def _assert_same_dcp(a: Path, b: Path) -> None:
    first, second = _dcp_tensors(a), _dcp_tensors(b)
    assert sorted(first["state_dict"]) == sorted(second["state_dict"])
    for key, value in first["state_dict"].items():
        assert torch.equal(value, second["state_dict"][key]), key
    for name, state in first["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value),
                               torch.as_tensor(second["optimizer"]["state"][name][key])), name


def test_sigterm_stops_fsdp_with_a_sharded_checkpoint_and_resume_is_bit_identical(runs):
    root, stopped = runs["root"], runs["stopped"]
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "stopped by SIGTERM after iteration 24 of 46" in stopped.stderr
    extra = torch.load(root / "stop" / "iter_24.dcp" / "extra.pth", weights_only=True)
    assert extra["meta"]["iter"] == 24 and len(extra["rng_states"]) == 2
    out = runs["after_stop"].stdout + runs["after_stop"].stderr
    assert "skipping iter_25.dcp" in out and "is truncated: its shard __1_0.distcp" in out
    assert "Resumed from" in out and "/iter_24.dcp: epoch" in out
    last = f"iter_{TWO_EPOCHS_ITERS}.dcp"
    _assert_same_dcp(root / "fsdp" / last, root / "stop" / last)


def test_bad_checkpoints_under_fsdp_are_one_line_naming_the_file(runs, tmp_path):
    """A sharded load_from with a cut shard; a corrupt full-state file to resume from
    (rank 0 reads it alone, and the other rank must learn of the failure, not wait)."""
    root = runs["root"]
    sharded = tmp_path / "cut.dcp"
    shutil.copytree(root / "fsdp" / "iter_20.dcp", sharded)
    (sharded / "__0_0.distcp").write_bytes((sharded / "__0_0.distcp").read_bytes()[:64])
    corrupt = tmp_path / "corrupt.pth"
    data = bytearray(Path((root / "ddp" / "last_checkpoint").read_text().strip()).read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    config = root / "fsdp" / "cfg.py"
    for flags, step, says in (
            (["--load-from", str(sharded)], "load_checkpoint",
             f"sharded checkpoint '{sharded}' is truncated: its shard __0_0.distcp"),
            (["--resume", str(corrupt), "--cfg-options", "strategy.state_dict_cfg=full"],
             "resume", f"checkpoint '{corrupt}' is corrupt")):
        done = flexgraph_run(str(config), "--work-dir", "bad", "--nproc-per-node", "2",
                             *flags, cwd=tmp_path)
        assert done.returncode != 0
        lines = [x for x in done.stderr.splitlines() if x.startswith(f"error: step {step!r}")]
        assert lines and all(says in x for x in lines), done.stderr[-3000:]
        assert "Traceback" not in done.stderr


def test_a_ddp_work_dir_resumes_under_fsdp_and_fsdp_shards_load_into_ddp(runs, tmp_path):
    """``--resume auto`` under FSDP in a DDP work_dir resumes DDP's newest ``.pth`` (its
    optimizer state renumbered by parameter name), never "starting from scratch".
    And the other way round, FSDP's sharded checkpoint seeds a DDP model (load_from)."""
    root = runs["root"]
    shutil.copytree(root / "ddp", tmp_path / "from_ddp")
    resumed = flexgraph_run(str(root / "fsdp" / "cfg.py"), "--work-dir", "from_ddp",
                            "--nproc-per-node", "2", "--resume", "auto", cwd=tmp_path)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "starting from scratch" not in out
    newest = Path((root / "ddp" / "last_checkpoint").read_text().strip()).name
    assert "Resumed from" in out and f"/{newest}: epoch 1, iter {TWO_EPOCHS_ITERS}" in out, \
        out[-3000:]

    sharded = root / "fsdp" / "iter_20.dcp"
    done = launch_two(root / "ddp" / "cfg.py", "seeded", tmp_path, "--entry", "val",
                      "--load-from", str(sharded))
    assert "val_result: {'accuracy/top1':" in done.stdout
    assert f"Loaded weights from {sharded}" in done.stdout + done.stderr

