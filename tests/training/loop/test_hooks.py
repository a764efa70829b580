"""Hooks: MMEngine Hook subclasses run unchanged, in MMEngine's order."""

from __future__ import annotations

import pytest
from mmengine.hooks import Hook

from flexgraph.training.loop import Hooks
from flexgraph.training.loop._hooks import HOOK_POINTS
from tests.training.training_helpers import RecordingHook, build_hooks, run_steps


def _collapse(calls):
    """Keep the order of points but collapse runs of per-iteration calls."""
    out = []
    for call in calls:
        point = call[0]
        if out and point in ("before_train_iter", "after_train_iter", "before_val_iter",
                             "after_val_iter") and out[-1][0] == "iters" and (
            out[-1][1] == point.split("_")[1]
        ):
            continue
        if point.endswith("_iter"):
            out.append(("iters", point.split("_")[1]))
        else:
            out.append((point,))
    return out


def test_hook_points_fire_in_documented_order(make_cfg):
    cfg = make_cfg(
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1)),
        custom_hooks=[dict(type="RecordingHook")],
    )
    run_steps(cfg)
    calls = RecordingHook.calls
    # MMEngine's order: the epoch checkpoint is saved inside after_train_epoch
    # (CheckpointHook, VERY_LOW priority), before validation.
    epoch = [("before_train_epoch",), ("iters", "train"), ("after_train_epoch",),
             ("before_save_checkpoint",), ("before_val",), ("before_val_epoch",),
             ("iters", "val"), ("after_val_epoch",), ("after_val",)]
    assert _collapse(calls) == [("before_run",), ("before_train",), *epoch, *epoch,
                                ("after_train",), ("after_run",)]
    # MMEngine's counters: iteration hooks see the index of the current iteration,
    # epoch hooks the index of the current epoch, val after an epoch the count.
    train_iters = [c for c in calls if c[0] == "after_train_iter"]
    assert [c[2] for c in train_iters] == list(range(20))
    assert [c[3] for c in train_iters] == list(range(10)) * 2  # batch_idx inside the epoch
    assert [c[1] for c in calls if c[0] == "after_train_epoch"] == [0, 1]
    assert [c[1:3] for c in calls if c[0] == "after_val"] == [(1, 10), (2, 20)]
    assert [c[1:3] for c in calls if c[0] == "before_save_checkpoint"] == [(0, 10), (1, 20)]


def test_iteration_loop_passes_global_index_and_wraps_epoch_hooks(make_cfg):
    cfg = make_cfg(
        train_cfg=dict(type="IterBasedTrainLoop", max_iters=25, val_interval=10),
        param_scheduler=None,
        custom_hooks=[dict(type="RecordingHook")],
    )
    run_steps(cfg)
    calls = RecordingHook.calls
    assert [c[0] for c in calls].count("before_train_epoch") == 1  # as in MMEngine
    assert [c[3] for c in calls if c[0] == "before_train_iter"] == list(range(25))
    assert [c[2] for c in calls if c[0] == "after_val"] == [10, 20, 25]


class _OnlyAfterIter(Hook):
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        pass


class _GenericAfterIter(Hook):
    def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
        pass


def test_dispatch_lists_only_overriding_hooks(make_cfg):
    runner = build_hooks(make_cfg()).runner
    hooks = Hooks([Hook(), _OnlyAfterIter(), _GenericAfterIter()], runner)
    assert hooks.before_train_iter == ()
    assert len(hooks.after_train_iter) == 2
    assert len(hooks.after_val_iter) == 1  # the generic override covers every mode
    assert all(getattr(Hooks([Hook()], runner), p) == () for p in HOOK_POINTS)


def test_priority_orders_hooks_stably(make_cfg):
    class Named(Hook):
        def __init__(self, name, priority="NORMAL"):
            self.name, self.priority = name, priority

        def before_run(self, runner):
            order.append(self.name)

    order: list[str] = []
    runner = build_hooks(make_cfg()).runner
    hooks = Hooks([Named("a"), Named("low", "LOW"), Named("b"), Named("high", "HIGHEST")],
                  runner)
    hooks.start_run()
    hooks.start_run()  # before_run fires once per run
    assert order == ["high", "a", "b", "low"]


def test_custom_hook_priority_key_and_builtin_defaults_keep_mmengine_places(make_cfg):
    cfg = make_cfg(
        default_hooks=dict(timer=dict(type="IterTimerHook"),
                           sampler_seed=dict(type="DistSamplerSeedHook"),
                           param_scheduler=dict(type="ParamSchedulerHook"),
                           checkpoint=dict(type="CheckpointHook", interval=1),
                           logger=dict(type="LoggerHook", interval=5)),
        custom_hooks=[dict(type="RecordingHook", priority="VERY_LOW"),
                      dict(type="EmptyCacheHook")],
    )
    hooks = build_hooks(cfg)
    # timer, sampler seed and logger are the loop's own work; the scheduler (LOW) and
    # checkpoint (VERY_LOW) hooks keep their places, ahead of custom hooks of equal
    # priority, as MMEngine registers default hooks first.
    assert [type(h).__name__ for h in hooks.hooks] == [
        "EmptyCacheHook", "ParamSchedulerHook", "BuiltinCheckpointHook", "RecordingHook"]


def test_default_hooks_set_to_none_are_removed(make_cfg):
    hooks = build_hooks(make_cfg(default_hooks=dict(param_scheduler=None, checkpoint=None)))
    assert hooks.hooks == () and hooks.after_train_iter == ()


def test_before_run_precedes_after_load_checkpoint(tmp_path, make_cfg):
    run_steps(make_cfg(default_hooks=dict(checkpoint=dict(interval=1))))
    ckpt = str(tmp_path / "work" / "epoch_1.pth")
    run_steps(make_cfg(load_from=ckpt, custom_hooks=[dict(type="RecordingHook")]))
    points = [c[0] for c in RecordingHook.calls]
    assert points[:3] == ["before_run", "after_load_checkpoint", "before_train"]
    assert points.count("before_run") == 1 and points[-1] == "after_run"


class _ReadsMessageHub(Hook):
    seen: list[float] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        _ReadsMessageHub.seen.append(runner.message_hub.get_scalar("train/loss").current())
        assert float(outputs["loss"]) == _ReadsMessageHub.seen[-1]


def test_iteration_hooks_see_mmengine_runtime_info(make_cfg):
    _ReadsMessageHub.seen = []
    run_steps(make_cfg(custom_hooks=[_ReadsMessageHub()], val_dataloader=None))
    assert len(_ReadsMessageHub.seen) == 30


def test_priorities_are_mmengines_without_importing_its_runner():
    from mmengine.runner import Priority, get_priority

    from flexgraph.training.errors import ConfigError
    from flexgraph.training.loop._hooks import PRIORITIES, _priority

    assert {p.name: p.value for p in Priority} == PRIORITIES
    for value in [*Priority, *(p.name.lower() for p in Priority), 0, 33, 100]:
        assert _priority(type("H", (), {"priority": value})()) == get_priority(value), value
    for bad in ("MIDDLE", 101, -1, 2.5):
        with pytest.raises(ConfigError, match="priority"):
            _priority(type("H", (), {"priority": bad})())


class _ReadsHubAtEpochEnd(Hook):
    """An epoch hook reading the hub, and the records a checkpoint save must follow.

    What it sees is kept on the class: the config holds (and copies) the instance.
    """

    metrics_file = None
    seen: list = []
    records_at_save: list = []

    def after_train_epoch(self, runner):
        _ReadsHubAtEpochEnd.seen.append(runner.message_hub.get_scalar("train/loss").current())

    def before_save_checkpoint(self, runner, checkpoint):
        import json

        lines = _ReadsHubAtEpochEnd.metrics_file.read_text().splitlines()
        _ReadsHubAtEpochEnd.records_at_save.append(
            (checkpoint["meta"]["iter"], json.loads(lines[-1])["iter"]))


def test_epoch_hooks_see_the_hub_current_and_saves_follow_the_records(tmp_path, make_cfg):
    """Log lines are composed in groups (output.py); a hook never sees a stale hub or file.

    Each epoch has 10 iterations and a line every 5: the hub's loss at the end of
    an epoch is what the epoch's last line says (the log processor's: the mean of
    the last 10 iterations), and when a checkpoint is saved metrics.jsonl already
    holds the record of its iteration.
    """
    import json

    hook = _ReadsHubAtEpochEnd
    hook.metrics_file = tmp_path / "work" / "metrics.jsonl"
    hook.seen, hook.records_at_save = [], []
    run_steps(make_cfg(custom_hooks=[hook()], val_dataloader=None,
                       default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1),
                                          logger=dict(type="LoggerHook", interval=5))))
    losses = [json.loads(line)["loss"] for line in hook.metrics_file.read_text().splitlines()]
    assert len(losses) == 30
    expected = [sum(losses[end - 10:end]) / 10 for end in (10, 20, 30)]
    assert hook.seen == pytest.approx(expected, rel=1e-12)
    assert hook.records_at_save == [(10, 10), (20, 20), (30, 30)]
