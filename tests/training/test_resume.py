"""Resume is bit-identical: a crashed-then-resumed run ends where an unbroken one does."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import read_checkpoint_file
from tests.training.training_helpers import assert_same, run_steps


@HOOKS.register_module(force=True)
class DrawsInValidation(Hook):
    """Draws from every global RNG during validation, as a random val augmentation would."""

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        torch.rand(3), random.random(), np.random.rand()


CASES = {
    # crash inside epoch 2, resume from an iteration checkpoint in its middle
    "mid-epoch": dict(checkpoint=dict(type="CheckpointHook", interval=7, by_epoch=False),
                      crash_at=16, resumed_from="iter_14.pth"),
    # crash inside epoch 2, resume from the checkpoint saved when epoch 1 ended
    "epoch-end": dict(checkpoint=dict(type="CheckpointHook", interval=1),
                      crash_at=13, resumed_from="epoch_1.pth"),
    # iteration-based loop, crash in the second pass over the data
    "iter-loop": dict(checkpoint=dict(type="CheckpointHook", interval=8, by_epoch=False),
                      crash_at=19, resumed_from="iter_16.pth",
                      train_cfg=dict(type="IterBasedTrainLoop", max_iters=30, val_interval=10)),
    # saved at the end of epoch 1, before a validation that draws random numbers (a
    # random val augmentation) and that the resumed run does not repeat; the hook is at
    # LOW priority, among the hooks that run before the checkpoint hook
    "before-random-val": dict(checkpoint=dict(type="CheckpointHook", interval=1),
                              crash_at=13, resumed_from="epoch_1.pth",
                              custom_hooks=[dict(type="DrawsInValidation", priority="LOW")]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_resumed_run_is_bit_identical(case, tmp_path, make_cfg):
    spec = dict(CASES[case])
    extra = {"train_cfg": spec["train_cfg"]} if "train_cfg" in spec else {}
    hooks = dict(checkpoint=spec["checkpoint"], logger=dict(type="LoggerHook", interval=5))
    custom = spec.get("custom_hooks", [])

    full = run_steps(make_cfg(work_dir=str(tmp_path / "full"), default_hooks=hooks,
                              custom_hooks=custom, **extra))

    broken = str(tmp_path / "broken")
    crash = [dict(type="CrashHook", at_iter=spec["crash_at"])]
    with pytest.raises(KeyboardInterrupt):
        run_steps(make_cfg(work_dir=broken, default_hooks=hooks, custom_hooks=custom + crash,
                           **extra))
    resumed = run_steps(make_cfg(work_dir=broken, default_hooks=hooks, resume="auto",
                                 custom_hooks=custom, **extra))

    assert resumed["loop_state"].resumed_from.endswith(spec["resumed_from"])
    assert_same(full["model"].state_dict(), resumed["model"].state_dict(), "model")
    assert_same(full["optim_wrapper"].state_dict(), resumed["optim_wrapper"].state_dict(),
                "optimizer")
    assert [s.get_last_value() for s in full["param_schedulers"]] == [
        s.get_last_value() for s in resumed["param_schedulers"]]
    assert full["train_result"]["loss"] == resumed["train_result"]["loss"]
    assert full["train_result"]["val/loss"] == resumed["train_result"]["val/loss"]
    # metrics.jsonl: the rolled-back records were cut, so both files match line by line
    assert _records(tmp_path / "full") == _records(tmp_path / "broken")


def _records(work):
    return [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]


def test_resume_auto_without_checkpoint_starts_fresh(make_cfg):
    ctx = run_steps(make_cfg(resume="auto"), last="resume")
    assert ctx["loop_state"].iter == 0 and ctx["loop_state"].resumed_from is None


def test_resume_from_explicit_path_and_from_finished_run(tmp_path, make_cfg):
    hooks = dict(checkpoint=dict(type="CheckpointHook", interval=1))
    first = run_steps(make_cfg(default_hooks=hooks))
    path = str(tmp_path / "work" / "epoch_2.pth")
    ctx = run_steps(make_cfg(default_hooks=hooks, resume=path), last="resume")
    assert (ctx["loop_state"].epoch, ctx["loop_state"].iter) == (2, 20)
    # resuming a finished run trains nothing more and leaves the weights alone
    done = run_steps(make_cfg(default_hooks=hooks, resume=True))
    assert done["train_result"]["iter"] == 30
    assert_same(first["model"].state_dict(), done["model"].state_dict())


def test_keep_last_prunes_only_after_saving_and_across_resume(tmp_path, make_cfg):
    hooks = dict(checkpoint=dict(type="CheckpointHook", interval=4, by_epoch=False,
                                 max_keep_ckpts=2))
    work = tmp_path / "work"
    with pytest.raises(KeyboardInterrupt):
        run_steps(make_cfg(default_hooks=hooks,
                           custom_hooks=[dict(type="CrashHook", at_iter=14)]))
    assert sorted(p.name for p in work.glob("*.pth")) == ["iter_12.pth", "iter_8.pth"]
    run_steps(make_cfg(default_hooks=hooks, resume="auto"))
    # saves at 16, 20, 24, 28 and the last one at 30; two are kept
    assert sorted(p.name for p in work.glob("*.pth")) == ["iter_28.pth", "iter_30.pth"]
    meta = read_checkpoint_file(work / "iter_30.pth")["meta"]
    assert meta["saved_checkpoints"] == ["iter_28.pth", "iter_30.pth"]
    # saved inside the last after_train_iter, with MMEngine's counters (epoch index 2),
    # after all 10 batches of the third pass over the data
    assert (meta["epoch"], meta["iter"], meta["data_pass"], meta["batch_idx"]) == (2, 30, 2, 10)


def test_resume_true_resumes_from_load_from(tmp_path, make_cfg):
    hooks = dict(checkpoint=dict(type="CheckpointHook", interval=1))
    run_steps(make_cfg(default_hooks=hooks))
    path = str(tmp_path / "work" / "epoch_1.pth")
    ctx = run_steps(make_cfg(work_dir=str(tmp_path / "other"), load_from=path, resume=True),
                    last="resume")
    assert ctx["loop_state"].resumed_from == path and ctx["loop_state"].iter == 10


def test_other_world_size_reseeds_instead_of_restoring(tmp_path, make_cfg):
    hooks = dict(checkpoint=dict(type="CheckpointHook", interval=1))
    run_steps(make_cfg(default_hooks=hooks))
    checkpoint = read_checkpoint_file(tmp_path / "work" / "epoch_1.pth")
    checkpoint["rng_states"] = checkpoint["rng_states"] * 2  # as if saved by 2 ranks
    path = tmp_path / "two_ranks.pth"
    torch.save(checkpoint, path)
    ctx = run_steps(make_cfg(default_hooks=hooks, resume=str(path)))
    assert ctx["loop_state"].rng_state is not None
    assert ctx["train_result"]["iter"] == 30


def test_resume_refuses_a_weights_only_file(tmp_path, make_cfg):
    raw = tmp_path / "raw.pth"
    torch.save(run_steps(make_cfg(), last="build_model")["model"].state_dict(), raw)
    with pytest.raises(CheckpointError, match="no training state"):
        run_steps(make_cfg(resume=str(raw)), last="resume")


def test_best_checkpoints_are_tracked_across_a_resume(tmp_path, make_cfg):
    hooks = dict(checkpoint=dict(type="CheckpointHook", interval=1, save_best="loss"))
    run_steps(make_cfg(work_dir=str(tmp_path / "full"), default_hooks=hooks))
    with pytest.raises(KeyboardInterrupt):
        run_steps(make_cfg(work_dir=str(tmp_path / "broken"), default_hooks=hooks,
                           custom_hooks=[dict(type="CrashHook", at_iter=24)]))
    run_steps(make_cfg(work_dir=str(tmp_path / "broken"), default_hooks=hooks, resume="auto"))

    def kept(name):
        return sorted(p.name for p in (tmp_path / name).glob("*.pth"))

    assert kept("broken") == kept("full")
    assert len([n for n in kept("full") if n.startswith("best_loss_")]) == 1
    meta = read_checkpoint_file(tmp_path / "broken" / "epoch_3.pth")["meta"]
    assert meta["runtime_info"]["best_ckpt"].endswith(next(
        n for n in kept("full") if n.startswith("best_loss_")))
