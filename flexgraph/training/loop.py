"""The training loop: epoch- or iteration-based, validation, checkpoints, logging.

Hot path first. Per iteration the loop does exactly: fetch a batch, call the
train step (forward, backward, optimizer step through the optimizer wrapper),
append the loss and the lr to the output's lists, step per-iteration schedulers, bump
two counters, and compare the iteration count with ``next_event``. Hooks nobody
overrides are empty tuples; logging, validation, checkpoints and progress
updates are all "events" whose next iteration number is precomputed, so
between events nothing else runs (no dict building, no ``.item()``, no I/O).

Order of hook points (MMEngine's, with one documented difference)::

    before_run                       (fired by the first step that needs hooks)
    before_train
      before_train_epoch             (once around the run in iteration mode)
        before_train_iter / after_train_iter      per batch
        [event: log line; iteration-mode validation; iteration checkpoint]
      after_train_epoch
      [epoch-mode validation: before_val, before_val_epoch, *_val_iter,
       after_val_epoch(metrics), after_val]
      [epoch checkpoint: before_save_checkpoint(checkpoint)]
    [last checkpoint]
    after_train
    after_run

Difference from MMEngine: a checkpoint due at the same point as a validation is
saved *after* it, so the checkpoint captures the state (RNG included) from which
the interrupted run actually continued; resuming therefore replays nothing.

Stopping on a signal (:mod:`flexgraph.training.preemption`): a stop request is
one more event. A single process checks its flag after every iteration (one
attribute read); several ranks agree every ``check_interval`` iterations. When
a stop is due, whatever else is due at that iteration happens first, then the
state is saved there (unless it just was) and :class:`TrainingStopped` ends the
run; no ``after_train`` / ``after_run``, since training did not finish.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from flexgraph.training.checkpoint import Checkpointer
from flexgraph.training.config import StopPolicy, TrainSchedule
from flexgraph.training.data import epoch_batches
from flexgraph.training.env import Env
from flexgraph.training.errors import EmptyDatasetError, TrainingStopped
from flexgraph.training.evaluate import run_evaluation
from flexgraph.training.hooks import Hooks
from flexgraph.training.optim import first_param_group
from flexgraph.training.output import TrainOutput
from flexgraph.training.preemption import StopRequest
from flexgraph.training.state import LoopState, restore_rng

__all__ = ["TrainLoop"]


def _next_multiple(n: int, k: int) -> int:
    """The smallest multiple of ``k`` strictly greater than ``n``."""
    return (n // k + 1) * k


class TrainLoop:
    """One training run over already-built artifacts.

    Construct it with what the ``train`` step received and call :meth:`run`.
    """

    def __init__(self, *, schedule: TrainSchedule, env: Env, model: torch.nn.Module,
                 train_step: Callable[[Any], Any], optim_wrapper: Any,
                 param_schedulers: list[Any], train_dataloader: Any,
                 val_dataloader: Any, val_evaluator: Any, checkpointer: Checkpointer | None,
                 hooks: Hooks, output: TrainOutput, log_interval: int,
                 state: LoopState, stop_policy: StopPolicy | None = None) -> None:
        self.schedule = schedule
        self.env = env
        self.model = model
        self.optim_wrapper = optim_wrapper
        self.param_schedulers = list(param_schedulers)
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.val_evaluator = val_evaluator
        self.checkpointer = checkpointer
        self.hooks = hooks
        self.output = output
        self.log_interval = log_interval
        self.state = state
        self.iter_schedulers = tuple(s for s in self.param_schedulers if not s.by_epoch)
        self.epoch_schedulers = tuple(s for s in self.param_schedulers if s.by_epoch)
        self.last_val: dict[str, Any] = {}
        # A resumed run does not re-save the checkpoint it started from.
        self._saved_at: int | None = state.iter if state.resumed_from else None
        self._next_tick = 0
        self._step = train_step
        self._lr_group = first_param_group(optim_wrapper)
        self._stop = StopRequest(stop_policy, world_size=env.world_size, rank=env.rank,
                                 device=env.device)
        self._saved_path: Any = state.resumed_from

    # -- the run ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``max_iters``; returns the final metrics."""
        s, hooks, runner, out = self.schedule, self.hooks, self.hooks.runner, self.output
        it, epoch, skip = self.state.iter, self.state.epoch, self.state.batch_idx
        pending_rng = self.state.rng_state
        batch_idx = skip
        t0 = time.perf_counter()
        out.open(it, resumed=self.state.resumed_from is not None)
        try:
            self._stop.install()
            hooks.start_run()
            self.model.train()
            runner.epoch, runner.iter = epoch, it
            runner.message_hub.update_info_dict(  # what MMEngine's RuntimeInfoHook records
                {"epoch": epoch, "iter": it, "max_epochs": s.max_epochs,
                 "max_iters": s.max_iters})
            hooks.call("before_train")
            self.optim_wrapper.initialize_count_status(self.model, it, s.max_iters)
            self._next_tick = out.tick(it)
            if not s.by_epoch:
                hooks.call("before_train_epoch")
            while it < s.max_iters:
                runner.epoch = epoch
                if pending_rng is not None and s.by_epoch and skip == 0:
                    restore_rng(pending_rng)  # saved right after the previous epoch ended
                    pending_rng = None
                if s.by_epoch:
                    hooks.call("before_train_epoch")
                batches = epoch_batches(self.train_dataloader, epoch, skip)
                if pending_rng is not None:
                    restore_rng(pending_rng)  # saved after batch `skip` of this epoch
                    pending_rng = None
                it, batch_idx, stopped = self._iterate(batches, it, epoch, skip)
                if batch_idx == 0:
                    raise EmptyDatasetError(
                        f"train_dataloader yielded no batch in epoch {epoch + 1}; check "
                        f"its dataset (an iterable dataset may be exhausted)")
                skip = 0
                if stopped and not s.by_epoch:
                    break  # max_iters reached in the middle of a pass over the data
                epoch = self._end_of_epoch(it, epoch, batch_idx)
                batch_idx = 0
            if not s.by_epoch:
                runner.iter = it
                hooks.call("after_train_epoch")
            out.log(it, epoch, batch_idx)
            out.tick(it)  # the bar ends at the last iteration, not at the last ~0.1 s tick
            if self.checkpointer is not None and self.checkpointer.save_last and (
                self._saved_at != it
            ):
                self._save(it, epoch, batch_idx)
            runner.iter = it
            hooks.call("after_train")
            hooks.end_run()
        finally:
            self._stop.uninstall()
            out.flush(runner.epoch)  # what an interrupted run trained on is recorded too
            out.close()
        return self._result(it, epoch, time.perf_counter() - t0)

    def _iterate(self, batches: Any, it: int, epoch: int,
                 batch_idx: int) -> tuple[int, int, bool]:
        """Train on ``batches``; returns (iterations done, batch index, hit max_iters)."""
        runner = self.hooks.runner
        step = self._step
        append_value, append_lr = self.output.values.append, self.output.lrs.append
        group = self._lr_group
        before, after = self.hooks.before_train_iter, self.hooks.after_train_iter
        schedulers = self.iter_schedulers
        by_epoch = self.schedule.by_epoch
        stop = self._stop
        next_event = self._next_event(it)
        for data_batch in batches:
            runner.iter = it
            if before:
                idx = batch_idx if by_epoch else it
                for fn in before:
                    fn(runner, batch_idx=idx, data_batch=data_batch)
            value = step(data_batch)
            append_value(value)
            append_lr(group["lr"])
            if after:
                self._after_iter(after, batch_idx if by_epoch else it, data_batch, value)
            for scheduler in schedulers:
                scheduler.step()
            it += 1
            batch_idx += 1
            if it >= next_event or stop.pending:
                if self._on_event(it, epoch, batch_idx):
                    return it, batch_idx, True
                next_event = self._next_event(it)
        return it, batch_idx, False

    def _after_iter(self, fns: tuple[Any, ...], idx: int, data_batch: Any, value: Any) -> None:
        """Hooks that read the message hub expect MMEngine's per-iteration updates."""
        runner = self.hooks.runner
        outputs = value if isinstance(value, Mapping) else {"loss": value}
        hub = runner.message_hub
        hub.update_info("iter", runner.iter)
        for key, v in outputs.items():
            hub.update_scalar(f"train/{key}", v)
        for fn in fns:
            fn(runner, batch_idx=idx, data_batch=data_batch, outputs=outputs)

    # -- events ---------------------------------------------------------------------------
    def _next_event(self, it: int) -> int:
        """The next iteration count at which anything besides training happens."""
        s = self.schedule
        candidates = [s.max_iters, _next_multiple(it, self.log_interval), self._next_tick]
        if not s.by_epoch and self.val_dataloader is not None:
            candidates.append(_next_multiple(max(it, s.val_begin - 1), s.val_interval))
        ck = self.checkpointer
        if ck is not None and ck.policy.enabled and not ck.policy.by_epoch and (
            ck.policy.interval > 0
        ):
            candidates.append(_next_multiple(it, ck.policy.interval))
        stop_check = self._stop.next_check(it)
        if stop_check is not None:
            candidates.append(stop_check)
        return min(candidates)

    def _on_event(self, it: int, epoch: int, batch_idx: int) -> bool:
        """Handle whatever is due after ``it`` iterations; True when training is done."""
        self.hooks.runner.iter = it  # as MMEngine: the count, once the iteration is over
        if it % self.log_interval == 0:
            self.output.log(it, epoch, batch_idx)
        if it >= self._next_tick:
            self._next_tick = self.output.tick(it)
        if self.val_dataloader is not None and self.schedule.val_due_after_iter(it):
            self._validate(it, epoch, shown_epoch=epoch + 1)
        if self.checkpointer is not None and self.checkpointer.due_after_iter(it):
            self._save(it, epoch, batch_idx)
        signum = self._stop.due(it)
        if signum and it < self.schedule.max_iters:  # on the last one, just finish
            self._stop_here(signum, it, epoch, batch_idx)
        return it >= self.schedule.max_iters

    def _end_of_epoch(self, it: int, epoch: int, batch_idx: int) -> int:
        """Epoch hooks, epoch schedulers, validation, checkpoint; returns the next epoch."""
        s, hooks, runner = self.schedule, self.hooks, self.hooks.runner
        self.output.log(it, epoch, batch_idx)
        runner.iter = it
        if s.by_epoch:
            hooks.call("after_train_epoch")
        for scheduler in self.epoch_schedulers:
            scheduler.step()
        epoch += 1
        runner.epoch = epoch
        runner.message_hub.update_info("epoch", epoch)
        if s.by_epoch:
            if self.val_dataloader is not None and s.val_due_after_epoch(epoch):
                self._validate(it, epoch, shown_epoch=epoch)
            if self.checkpointer is not None and self.checkpointer.due_after_epoch(epoch):
                self._save(it, epoch, 0)
        return epoch

    def _validate(self, it: int, epoch: int, *, shown_epoch: int) -> None:
        self.output.flush(epoch)
        metrics = run_evaluation(mode="val", model=self.model, dataloader=self.val_dataloader,
                                 evaluator=self.val_evaluator, hooks=self.hooks, env=self.env)
        self.last_val = dict(metrics)
        self.output.eval_metrics(metrics, mode="val", iters_done=it, epoch=shown_epoch)

    def _save(self, it: int, epoch: int, batch_idx: int) -> None:
        """Save the state after ``it`` iterations; ``epoch`` = completed epochs."""
        checkpoint = self.checkpointer.snapshot(
            model=self.model, optim_wrapper=self.optim_wrapper,
            param_schedulers=self.param_schedulers, epoch=epoch, iteration=it,
            batch_idx=batch_idx, seed=self.env.seed)
        self.hooks.call("before_save_checkpoint", checkpoint=checkpoint)
        by_epoch = self.checkpointer.policy.by_epoch and self.schedule.by_epoch
        stem = f"epoch_{epoch}" if by_epoch and batch_idx == 0 else f"iter_{it}"
        path = self.checkpointer.save(checkpoint, stem, model=self.model,
                                      optim_wrapper=self.optim_wrapper)
        self._saved_at, self._saved_path = it, path
        self.output.info(f"Saved checkpoint {path}")

    def _stop_here(self, signum: int, it: int, epoch: int, batch_idx: int) -> None:
        """Save the state after ``it`` iterations (unless just saved) and end the run."""
        name = signal.Signals(signum).name
        self.output.info(f"{name}: stopping after iteration {it}")
        path = None
        if self.checkpointer is not None:
            if self._saved_at != it:
                self._save(it, epoch, batch_idx)
            path = str(self._saved_path)
        saved = f"saved {path}" if path else "nothing saved (no checkpointer)"
        raise TrainingStopped(
            f"stopped by {name} after iteration {it} of {self.schedule.max_iters}; {saved}",
            signal_name=name, iteration=it, checkpoint=path, rank=self.env.rank)

    def _result(self, it: int, epoch: int, seconds: float) -> dict[str, Any]:
        result: dict[str, Any] = {"iter": it, "epoch": epoch, "time_s": seconds}
        result.update(self.output.last_values)
        result.update({f"val/{k}": v for k, v in self.last_val.items()})
        return result
