"""What hooks read of MMEngine's Runner: there with MMEngine's meaning, or refused when built."""

from __future__ import annotations

import mmengine.hooks
import pytest
from mmengine.hooks import Hook

from flexgraph.training.errors import ConfigError
from flexgraph.training.loop._hooks import _runner_reads, refuse_unknown_reads
from tests.training.training_helpers import build_hooks, run_steps


class ReadsTheRunner(Hook):
    """Records what MMPreTrain's and MMEngine's hooks read of the runner."""

    seen: dict = {}

    def before_train(self, runner) -> None:
        self.seen.update(resume=runner._resume, log_dir=runner._log_dir,
                         loader=runner.train_loop.dataloader is runner.train_dataloader)

    def after_val_epoch(self, runner, metrics=None) -> None:
        loop = runner.val_loop  # MMPreTrain's EMAHook evaluates again through it
        self.seen["val"] = loop.dataloader is runner.val_dataloader
        self.seen["evaluator"] = loop.evaluator is runner.val_evaluator


class ReadsLogProcessor(Hook):
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        runner.log_processor.get_log_after_iter(runner, batch_idx, "train")


def test_hooks_read_mmengine_s_private_attributes_with_its_meaning(make_cfg, tmp_path):
    run_steps(make_cfg(train_cfg=dict(by_epoch=True, max_epochs=1),
                       custom_hooks=[ReadsTheRunner()]))
    assert ReadsTheRunner.seen == {"resume": False, "log_dir": str(tmp_path / "work"),
                                   "loader": True, "val": True, "evaluator": True}
    ReadsTheRunner.seen.clear()
    run_steps(make_cfg(train_cfg=dict(by_epoch=True, max_epochs=2), resume=True,
                       custom_hooks=[ReadsTheRunner()]))
    assert ReadsTheRunner.seen["resume"] is True


def test_a_hook_reading_what_the_view_lacks_is_refused_when_built(make_cfg):
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\]: ReadsLogProcessor reads "
                                          r"runner\.log_processor: flexgraph writes"):
        build_hooks(make_cfg(custom_hooks=[ReadsLogProcessor()]))
    with pytest.raises(ConfigError, match=r"EarlyStoppingHook reads "
                                          r"runner\.train_loop\.stop_training"):
        build_hooks(make_cfg(custom_hooks=[dict(type="EarlyStoppingHook", monitor="loss")]))


#: MMEngine's hooks whose work flexgraph's loop does itself (never built), or which it
#: refuses by name (EarlyStoppingHook: the loop does not stop early)
NOT_BUILT = {"LoggerHook", "CheckpointHook", "EarlyStoppingHook"}


@pytest.mark.parametrize("package", ["mmengine.hooks", "mmpretrain.engine.hooks",
                                     "mmdet.engine.hooks"])
def test_every_hook_of_the_openmmlab_packages_finds_what_it_reads(package, make_cfg):
    """The audit: each registered hook's source, read against the view."""
    module = pytest.importorskip(package)
    runner = build_hooks(make_cfg()).runner
    refused = {}
    for name in dir(module):
        cls = getattr(module, name)
        if isinstance(cls, type) and issubclass(cls, Hook) and cls.__name__ not in NOT_BUILT:
            try:
                refuse_unknown_reads(object.__new__(cls), name, runner)
            except ConfigError as error:
                refused[name] = str(error)
    assert refused == {}


def test_the_audit_reads_the_hooks_sources():
    assert ("_resume", "") in _runner_reads(mmengine.hooks.EMAHook)
    assert ("train_loop", "dataloader") in _runner_reads(mmengine.hooks.DistSamplerSeedHook)
