"""Config keys flexgraph does not act on are reported by name; bad checkpoint and
visualizer options refused."""

from __future__ import annotations

import sys

import pytest
from mmengine.config import Config

from flexgraph.training.config._checks import check_sections
from flexgraph.training.config._keys import unused_keys
from flexgraph.training.config._settings import checkpoint_policy
from flexgraph.training.errors import ConfigError, UnusedConfigWarning
from tests.training.training_helpers import build_hooks, run_steps

# What OpenMMLab's default_runtime.py files and MMEngine's Runner arguments add to a
# config, beside the sections flexgraph reads.
MMENGINE_EXTRAS = dict(
    default_scope="mmengine",
    env_cfg=dict(cudnn_benchmark=False, mp_cfg=dict(mp_start_method="fork"),
                 dist_cfg=dict(backend="nccl")),
    vis_backends=[dict(type="LocalVisBackend")],
    visualizer=dict(type="DetLocalVisualizer", name="visualizer",
                    vis_backends=[dict(type="LocalVisBackend"), dict(type="WandbVisBackend")]),
    log_processor=dict(type="LogProcessor", window_size=50, by_epoch=True),
    launcher="mpi",
    auto_scale_lr=dict(base_batch_size=256, enable=True),
    train_cfg=dict(by_epoch=True, max_epochs=3, dynamic_intervals=[(2, 1)]),
    val_cfg=dict(type="ValLoop", fp16=True),
    default_hooks=dict(
        timer=dict(type="IterTimerHook"),
        logger=dict(type="LoggerHook", interval=5, interval_exp_name=100, out_dir="s3://x"),
        checkpoint=dict(type="CheckpointHook", interval=1, out_dir="/elsewhere",
                        filename_tmpl="ep{}.pth", save_optimizer=False),
        visualization=dict(type="SomeVisualizationHook", draw=True),
    ),
    # a config's own variables: MMEngine's Runner does not read them either
    train_pipeline=[dict(type="LoadImage")], data_root="data/", dataset_type="Toy",
    test_pipeline=[dict(type="LoadImage")],  # as close to tta_pipeline as a typo would be
)


def test_each_key_flexgraph_does_not_act_on_is_named():
    messages = list(unused_keys(Config(MMENGINE_EXTRAS)))
    named = {m.split("'")[1] for m in messages}
    assert named == {  # the visualizer is built as MMEngine builds it: none of its keys
        "env_cfg.mp_cfg",
        "launcher",
        "auto_scale_lr", "train_cfg.dynamic_intervals", "val_cfg.fp16",
        "default_hooks.logger.interval_exp_name", "default_hooks.logger.out_dir",
        "default_hooks.checkpoint.out_dir", "default_hooks.checkpoint.filename_tmpl",
        "default_hooks.checkpoint.save_optimizer",
    }
    assert all(": " in m for m in messages), "each says why"


def test_a_near_miss_of_a_known_section_is_refused():
    """A misspelled ``param_scheduler`` would train at a constant rate: an error, naming both."""
    with pytest.raises(ConfigError, match=r"'param_schedular' .* did you mean 'param_scheduler'"):
        check_sections(Config({**MMENGINE_EXTRAS, "param_schedular": dict(type="MultiStepLR")}))
    # a config's own: train_pipeline, test_pipeline, MMDetection's val_evaluator_abs
    check_sections(Config({**MMENGINE_EXTRAS, "val_evaluator_abs": dict(type="Metric")}))


def test_what_flexgraph_acts_on_raises_no_warning(make_cfg):
    cfg = make_cfg(launcher="slurm",
                   visualizer=dict(type="Visualizer", name="visualizer", vis_backends=[
                       dict(type="LocalVisBackend"), dict(type="TensorboardVisBackend")]),
                   env_cfg=dict(dist_cfg=dict(backend="gloo")),
                   auto_scale_lr=dict(base_batch_size=16, enable=False), val_cfg=dict(),
                   default_hooks=dict(
                       logger=dict(type="LoggerHook", interval=2, ignore_last=False),
                       checkpoint=dict(type="CheckpointHook", interval=2, save_best="loss",
                                       max_keep_ckpts=1, published_keys=["state_dict"])))
    assert list(unused_keys(cfg)) == []


def test_the_run_warns_once_per_key(make_cfg):
    with pytest.warns(UnusedConfigWarning,
                      match="'default_hooks.logger.out_dir' is not used by flexgraph"):
        build_hooks(make_cfg(default_hooks=dict(logger=dict(type="LoggerHook",
                                                            out_dir="elsewhere"))))


@pytest.mark.parametrize("visualizer, wanted", [
    (None, ["LocalVisBackend"]),
    (dict(type="Visualizer", vis_backends=[dict(type="LocalVisBackend")]), ["LocalVisBackend"]),
    (dict(vis_backends=[dict(type="LocalVisBackend"), dict(type="TensorboardVisBackend")]),
     ["LocalVisBackend", "TensorboardVisBackend"]),
    (dict(vis_backends=dict(type="mmengine.TensorboardVisBackend")), ["TensorboardVisBackend"]),
])
def test_tensorboard_only_when_a_backend_asks_for_it_as_in_mmengine(make_cfg, visualizer,
                                                                     wanted):
    backends = build_hooks(make_cfg(visualizer=visualizer)).runner.visualizer._vis_backends
    assert [type(b).__name__ for b in backends.values()] == wanted


def test_tensorboard_asked_for_but_not_installed_is_a_config_error(make_cfg, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    cfg = make_cfg(visualizer=dict(vis_backends=[dict(type="TensorboardVisBackend")]))
    with pytest.raises(ConfigError, match="tensorboard is not installed: pip install"):
        run_steps(cfg, last="train")


def test_a_vis_backend_without_a_type_is_refused(make_cfg):
    with pytest.raises(ConfigError, match=r"visualizer.vis_backends\[0\]: .* has no type"):
        build_hooks(make_cfg(visualizer=dict(vis_backends=[dict(save_dir="x")])))


@pytest.mark.parametrize("options, message", [
    (dict(save_best="loss", rule="bigger"), "rule must be 'greater', 'less'"),
    (dict(save_best="fid"), "cannot infer whether a greater or a smaller 'fid'"),
    (dict(save_best=["acc", "auto"]), "'auto' must stand alone"),
    (dict(save_best=["acc", "loss"], rule=["greater", "less", "less"]), "3 rules for 2"),
    (dict(published_keys=3), "published_keys must be a str or a list of str"),
])
def test_bad_save_best_options_are_refused_by_name(make_cfg, options, message):
    cfg = make_cfg(default_hooks=dict(checkpoint=dict(type="CheckpointHook", **options)))
    with pytest.raises(ConfigError, match=message):
        checkpoint_policy(cfg)


def test_rules_are_inferred_as_mmengine_infers_them(make_cfg):
    def policy(**options):
        return checkpoint_policy(make_cfg(default_hooks=dict(checkpoint=options)))

    assert policy(save_best=["accuracy/top1", "loss", "mIoU"]).rules == ("greater", "less",
                                                                        "greater")
    assert policy(save_best="fid", less_keys=["fid"]).rules == ("less",)
    assert policy(save_best="auto").rules == (None,)  # decided by the first metric's name
