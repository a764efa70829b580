"""Stopping on a signal, in one process: after the iteration, at a checkpoint, resumable.

Signals here are real: a hook sends them to this very process, where the
loop's handlers are installed only while training runs. Two ranks are tested
end to end in tests/cli/test_chaos_cli.py.
"""

from __future__ import annotations

import os
import random
import signal

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from flexgraph.training.components import build_dataloader
from flexgraph.training.config import StopPolicy
from flexgraph.training.config._settings import stop_policy
from flexgraph.training.errors import ConfigError, TrainingStopped
from flexgraph.training.formats import read_checkpoint_file
from flexgraph.training.runtime import Env
from tests.training.training_helpers import assert_same, run_steps

HOOKS_CFG = dict(checkpoint=dict(type="CheckpointHook", interval=7, by_epoch=False),
                 logger=dict(type="LoggerHook", interval=5))


@HOOKS.register_module(force=True)
class SignalSelf(Hook):
    """Sends ``sig`` to this process after ``at_iter`` iterations; ``again``: once more
    right before the save that follows; records the SIGTERM handler it trains under."""

    seen: list[object] = []

    def __init__(self, at_iter: int, sig: str = "SIGTERM", again: bool = False) -> None:
        self.at_iter, self.sig, self.again = at_iter, getattr(signal, sig), again
        SignalSelf.seen = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        SignalSelf.seen.append(signal.getsignal(signal.SIGTERM))
        if runner.iter + 1 == self.at_iter:
            os.kill(os.getpid(), self.sig)

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        if self.again and runner.iter >= self.at_iter:
            os.kill(os.getpid(), self.sig)


def _stop(make_cfg, work, at, sig="SIGTERM", again=False, **extra):
    hooks = [dict(type="SignalSelf", at_iter=at, sig=sig, again=again)]
    with pytest.raises(TrainingStopped) as stopped:
        run_steps(make_cfg(work_dir=str(work), default_hooks=HOOKS_CFG, custom_hooks=hooks,
                           **extra))
    return stopped.value


def test_signals_at_random_iterations_stop_there_and_resume_bit_identical(tmp_path, make_cfg):
    before = signal.getsignal(signal.SIGTERM)
    full = run_steps(make_cfg(work_dir=str(tmp_path / "full"), default_hooks=HOOKS_CFG))
    rng = random.Random(7)
    trials = [("SIGTERM", {}), ("SIGINT", {}), ("SIGUSR1", {"preemption": {"signal": "USR1"}}),
              ("SIGTERM", {}), ("SIGTERM", {})]
    work, done = tmp_path / "cut", 0
    for n, (sig, extra) in enumerate(trials):
        at = done + rng.randint(1, 5)  # 30 iterations in all
        print(f"trial {n}: {sig} after iteration {at}")
        resume = {"resume": "auto"} if n else {}
        stop = _stop(make_cfg, work, at, sig, **extra, **resume)
        assert (stop.signal_name, stop.iteration) == (sig, at)
        assert stop.checkpoint == str(work / f"iter_{at}.pth")
        assert read_checkpoint_file(stop.checkpoint)["meta"]["iter"] == at
        assert signal.getsignal(signal.SIGTERM) == before, "handlers are put back"
        done = at
    resumed = run_steps(make_cfg(work_dir=str(work), default_hooks=HOOKS_CFG, resume="auto"))
    assert resumed["loop_state"].resumed_from.endswith(f"iter_{done}.pth")
    assert_same(full["model"].state_dict(), resumed["model"].state_dict(), "model")
    assert_same(full["optim_wrapper"].state_dict(), resumed["optim_wrapper"].state_dict(),
                "optimizer")


@pytest.mark.parametrize("at", [10, 20], ids=["end of epoch 1", "end of epoch 2"])
def test_a_stop_at_the_end_of_an_epoch_resumes_with_that_epochs_end(tmp_path, make_cfg, at):
    """Stopped after an epoch's last batch, before its end-of-epoch work (schedulers,
    validation): the resumed run does that work first, as the unbroken run did."""
    full = run_steps(make_cfg(work_dir=str(tmp_path / "full"), default_hooks=HOOKS_CFG))
    stop = _stop(make_cfg, tmp_path / "cut", at)
    saved = read_checkpoint_file(stop.checkpoint)["meta"]
    assert (saved["iter"], saved["batch_idx"], saved["epoch"]) == (at, 10, at // 10 - 1)
    resumed = run_steps(make_cfg(work_dir=str(tmp_path / "cut"), default_hooks=HOOKS_CFG,
                                 resume="auto"))
    assert_same(full["model"].state_dict(), resumed["model"].state_dict(), "model")
    for key, value in full["train_result"].items():  # loss, lr, val/accuracy, ...
        if key != "time_s":
            assert resumed["train_result"][key] == value, key


def test_a_second_signal_during_the_save_does_not_interrupt_it(tmp_path, make_cfg):
    stop = _stop(make_cfg, tmp_path / "w", 10, again=True)
    assert stop.iteration == 10
    state = read_checkpoint_file(stop.checkpoint)  # whole: the save ran to its end
    assert state["meta"]["iter"] == 10
    assert (tmp_path / "w" / "last_checkpoint").read_text().endswith("iter_10.pth")


def test_a_stop_due_at_a_periodic_checkpoint_saves_once(tmp_path, make_cfg):
    stop = _stop(make_cfg, tmp_path / "w", 14)  # checkpoint interval 7
    assert stop.checkpoint.endswith("iter_14.pth")
    assert sorted(p.name for p in (tmp_path / "w").glob("*.pth")) == ["iter_14.pth",
                                                                       "iter_7.pth"]


def test_a_signal_in_the_last_iteration_lets_the_run_finish(tmp_path, make_cfg):
    hooks = [dict(type="SignalSelf", at_iter=30)]
    result = run_steps(make_cfg(default_hooks=HOOKS_CFG, custom_hooks=hooks))
    assert result["train_result"]["iter"] == 30


def test_handlers_live_only_while_training_and_preemption_none_installs_none(make_cfg):
    before = signal.getsignal(signal.SIGTERM)
    run_steps(make_cfg(default_hooks=HOOKS_CFG, custom_hooks=[dict(type="SignalSelf",
                                                                    at_iter=-1)]))
    assert all(callable(h) and h != before for h in SignalSelf.seen)
    assert signal.getsignal(signal.SIGTERM) == before
    run_steps(make_cfg(default_hooks=HOOKS_CFG, preemption=None,
                       custom_hooks=[dict(type="SignalSelf", at_iter=-1)]))
    assert set(SignalSelf.seen) == {before}


def test_stop_policy_reads_the_config_and_refuses_what_cannot_work():
    assert stop_policy({}) == StopPolicy(("SIGTERM", "SIGINT"), 10)
    assert stop_policy({"preemption": None}).signals == ()
    assert stop_policy({"preemption": {"signal": "usr1", "check_interval": 3}}) == \
        StopPolicy(("SIGTERM", "SIGINT", "SIGUSR1"), 3)
    assert stop_policy({"preemption": {"signal": [12, "SIGTERM"]}}).signals == \
        ("SIGTERM", "SIGINT", "SIGUSR2")
    for bad, match in [({"signal": "SIGFOO"}, "not a signal"),
                       ({"signal": "KILL"}, "cannot stop a run cleanly"),
                       ({"check_interval": 0}, "check_interval must be"),
                       ({"signals": ["SIGUSR1"]}, "preemption.signals is not an option")]:
        with pytest.raises(ConfigError, match=match):
            stop_policy({"preemption": bad})


class _Dispositions(torch.utils.data.Dataset):
    """Each item: whether SIGTERM and SIGUSR1 are ignored in the process that loads it."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([signal.getsignal(s) is signal.SIG_IGN
                             for s in (signal.SIGTERM, signal.SIGUSR1)])


@pytest.mark.slow
def test_dataloader_workers_ignore_the_stop_signals_their_rank_handles():
    """A scheduler or launcher signals the workers too; they must not die under their rank."""
    from mmengine.registry import DATASETS

    DATASETS.register_module(module=_Dispositions, force=True)
    cfg = dict(batch_size=2, num_workers=1, dataset=dict(type="_Dispositions"))
    loader = build_dataloader(cfg, Env(), stop_signals=("SIGTERM", "SIGINT", "SIGUSR1"))
    assert next(iter(loader)).tolist() == [[True, True], [True, True]]
    alone = build_dataloader(dict(cfg, num_workers=0), Env(), stop_signals=("SIGTERM",))
    assert next(iter(alone)).tolist() == [[False, False], [False, False]]
