"""Resuming across strategies and world sizes through ``flexgraph run --resume auto``.

One work_dir is carried through a chain in which every strategy writes and
reads: ZeRO-3 (2 processes) -> DDP (2) -> FSDP (2) -> ZeRO-1 (2), one epoch (23
optimizer steps) each; ZeRO-3, FSDP and ZeRO-1 write the portable format, DDP
MMEngine's ``.pth``, which FSDP resumes (the case that used to be refused);
single device writes and reads in the world-size tests. The chain's final
weights and Adam moments must match one uninterrupted DDP run to 1e-5 relative
(fp32; DeepSpeed's and FSDP's reductions differ from DDP's in the order of sums
only). The world-size tests resume in
the middle of an epoch on another number of processes: the global batch is
held (the per-process batch changes), every remaining sample of the epoch is
trained on exactly once, and the result matches the run that never changed.
"""

from __future__ import annotations

import pytest
import torch

from flexgraph.training.checkpoint import portable_tensors, read_manifest, read_portable_tensor
from flexgraph.training.checkpoint_tools import describe_checkpoint
from tests.cli.cli_helpers import same_start
from tests.cli.portable_helpers import (
    as_one_file,
    assert_same_weights,
    config,
    last_checkpoint,
    recorded_ids,
    run,
)

pytestmark = pytest.mark.slow

pytest.importorskip("deepspeed")

CHAIN = ("zero3", "ddp", "fsdp", "zero1")
EPOCH = 23  # iterations per epoch: 1438 samples, a global batch of 64


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("portable")
    start = same_start(root)
    outputs = []
    for leg, strategy in enumerate(CHAIN, start=1):
        cfg = config(root / f"leg{leg}", strategy, start, epochs=leg)
        outputs.append(run(cfg, strategy, "chain", root, "--resume", "auto"))
    reference = config(root / "reference", "ddp", start, epochs=len(CHAIN))
    run(reference, "ddp", "reference", root)
    return {"root": root, "outputs": outputs}


def test_a_chain_of_strategies_resumes_each_others_checkpoints_like_one_run(chain):
    root = chain["root"]
    last = last_checkpoint(root / "chain")
    assert last.name == f"epoch_{len(CHAIN)}.ckpt"
    reference = torch.load(last_checkpoint(root / "reference"), weights_only=True)
    assert list(reference["state_dict"]) == [  # the order DDP's optimizer numbers them in
        k.removeprefix("model.") for k in portable_tensors(last) if k.startswith("model.")]
    assert_same_weights(as_one_file(last), reference)
    # the step count is carried: every leg's steps, in Adam's state
    assert float(read_portable_tensor(last, "optimizer.net.0.weight.step")) == \
        len(CHAIN) * EPOCH


def test_each_resume_continues_from_the_previous_strategys_checkpoint(chain):
    root, outputs = chain["root"], chain["outputs"]
    for leg, out in enumerate(outputs[1:], start=2):
        previous = CHAIN[leg - 2]
        suffix = ".pth" if previous == "ddp" else ".ckpt"
        assert f"Resumed from {root / 'chain' / f'epoch_{leg - 1}{suffix}'}: epoch {leg - 1}, " \
               f"iter {(leg - 1) * EPOCH}" in out, out[-3000:]
        assert "starting from scratch" not in out
    # the plan that wrote the checkpoint, next to this run's (strategy and world size)
    assert "resume: the checkpoint's plan (deepspeed x 2) -> this run's (ddp x 2)" in outputs[1]
    assert "- deepspeed_initialize" in outputs[1] and "+ wrap_model" in outputs[1]


def test_the_portable_checkpoints_say_who_wrote_them(chain):
    work = chain["root"] / "chain"
    for epoch, strategy in ((1, "deepspeed"), (3, "fsdp"), (4, "deepspeed")):
        path = work / f"epoch_{epoch}.ckpt"
        manifest = read_manifest(path)
        assert (manifest["strategy"], manifest["world_size"], manifest["iter"]) == \
            (strategy, 2, epoch * EPOCH)
        assert manifest["plan"]["strategy"] == strategy
        assert manifest["optimizer_keys"] == ["exp_avg", "exp_avg_sq", "step"]
        summary = describe_checkpoint(path)
        assert summary.complete and summary.writer == f"flexgraph portable, {strategy}"
        assert {"model", "optimizer", "param_schedulers", "rng states"} <= set(
            summary.contents)
        assert summary.parameters == sum(
            t.numel() for t in torch.load(work / "epoch_2.pth",
                                          weights_only=True)["state_dict"].values())


@pytest.fixture(scope="module")
def two_to_one(tmp_path_factory):
    """DDP on 2 processes killed after iteration 35 (saved at 30, mid-epoch 2); one process
    resumes it. Reference: DDP on 2 processes throughout."""
    root = tmp_path_factory.mktemp("two_to_one")
    start = same_start(root)
    common = dict(epochs=2, interval=10, by_epoch=False, record_ids=True)
    killed = config(root / "killed", "ddp", start, at_iter=35, rank=0, **common)
    run(killed, "ddp", "work", root, ok=False)
    resumed = config(root / "resumed", "single", start, **common)
    out = run(resumed, "single", "work", root, "--resume", "auto")
    reference = config(root / "reference", "ddp", start, **common)
    run(reference, "ddp", "reference", root)
    return {"root": root, "out": out}


def test_two_processes_to_one_mid_epoch_holds_the_global_batch_and_matches(two_to_one):
    root, out = two_to_one["root"], two_to_one["out"]
    assert "Resumed from" in out and "iter_30.pth: epoch 1, iter 30" in out
    assert "global batch 64 held over 1 processes: train_dataloader batch 32 -> 64" in out
    resumed = torch.load(last_checkpoint(root / "work"), weights_only=True)
    reference = torch.load(last_checkpoint(root / "reference"), weights_only=True)
    assert_same_weights(resumed, reference)


def test_two_processes_to_one_mid_epoch_sees_every_remaining_sample_once(two_to_one):
    work = two_to_one["root"] / "work"
    # epoch 2 is iterations 23..45: 23..29 trained on 2 processes, 30..45 on one
    before = recorded_ids(work, world=2, below_iter=30, from_iter=EPOCH)
    after = recorded_ids(work, world=1)
    assert [it for it, _ in after] == list(range(30, 2 * EPOCH))
    assert all(len(ids) == 64 for _, ids in after[:-1])
    from digits import DigitsDataset  # on the path since same_start

    seen = [i for _, ids in before + after for i in ids]
    assert sorted(seen) == list(range(len(DigitsDataset(split="train")))), \
        "every sample of the epoch exactly once"


@pytest.fixture(scope="module")
def one_to_two(tmp_path_factory):
    """One process killed after iteration 35 (saved at 30); DDP on 2 resumes it."""
    root = tmp_path_factory.mktemp("one_to_two")
    start = same_start(root)
    common = dict(epochs=1, interval=10, by_epoch=False)
    run(config(root / "killed", "single", start, at_iter=35, rank=0, **common), "single",
        "work", root, ok=False)
    out = run(config(root / "resumed", "ddp", start, **common), "ddp", "work", root,
              "--resume", "auto")
    run(config(root / "reference", "single", start, **common), "single", "reference", root)
    return {"root": root, "out": out}


def test_one_process_to_two_halves_the_batch_per_process_and_matches(one_to_two):
    root, out = one_to_two["root"], one_to_two["out"]
    assert "global batch 32 held over 2 processes: train_dataloader batch 32 -> 16" in out
    resumed = torch.load(last_checkpoint(root / "work"), weights_only=True)
    reference = torch.load(last_checkpoint(root / "reference"), weights_only=True)
    assert resumed["meta"]["iter"] == reference["meta"]["iter"] == 45
    assert_same_weights(resumed, reference)
