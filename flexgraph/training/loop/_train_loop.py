"""The training loop: epoch- or iteration-based, validation, checkpoints, logging.

Order of hook points and of the built-in work, as MMEngine's Runner has them::

    before_run                       (fired by the first step that needs hooks)
    before_train
      before_train_epoch             (once around the run in iteration mode)
        before_train_iter
        after_train_iter             by priority; at LOW the iteration schedulers
                                     step (ParamSchedulerHook), at VERY_LOW an
                                     iteration checkpoint is saved
                                     (before_save_checkpoint)
        [log line (LoggerHook's interval and ignore_last); iteration-mode validation]
      after_train_epoch              at LOW the epoch schedulers step, at VERY_LOW
                                     an epoch checkpoint is saved
      [epoch-mode validation: before_val, before_val_epoch, *_val_iter,
       after_val_epoch(metrics) (VERY_LOW: best checkpoint), after_val]
    after_train                      (VERY_LOW: published checkpoints)
    after_run

Unlike MMEngine, validation runs on a fork of the RNG streams, so training
randomness does not depend on how often the run validates. On a stop signal
what is due at that iteration happens first, then a save, then
:class:`TrainingStopped` (without ``after_train``/``after_run``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from mmengine.hooks import ParamSchedulerHook

from flexgraph.training.checkpoint import Checkpointer, LoopState
from flexgraph.training.components import epoch_batches, first_param_group, per_rank_batch
from flexgraph.training.config import StopPolicy, TrainSchedule
from flexgraph.training.errors import EmptyDatasetError, TrainingStopped
from flexgraph.training.loop._checkpoint_hook import BEST_INFO_PREFIXES, BuiltinCheckpointHook
from flexgraph.training.loop._evaluate import run_evaluation
from flexgraph.training.loop._hooks import Hooks
from flexgraph.training.loop._preemption import StopRequest
from flexgraph.training.output import TrainOutput
from flexgraph.training.runtime import Env, capture_rng, restore_rng


def _may_read_outputs(hook_method: Any) -> bool:
    """Whether an ``after_train_iter`` hook may read the iteration's outputs from the hub."""
    owner = type(getattr(hook_method, "__self__", None))
    return owner is not ParamSchedulerHook and owner is not BuiltinCheckpointHook


def _next_multiple(n: int, k: int) -> int:
    return (n // k + 1) * k


class TrainLoop:
    """One training run over already-built artifacts: what the ``train`` step received."""

    def __init__(self, *, schedule: TrainSchedule, env: Env, model: torch.nn.Module,
                 train_step: Callable[[Any], Any], optim_wrapper: Any,
                 param_schedulers: Any, train_dataloader: Any,
                 val_dataloader: Any, val_evaluator: Any, checkpointer: Checkpointer | None,
                 hooks: Hooks, output: TrainOutput, log_interval: int,
                 state: LoopState, log_ignore_last: bool = True,
                 stop_policy: StopPolicy | None = None) -> None:
        self.schedule = schedule
        self.env = env
        self.model = model
        self.optim_wrapper = optim_wrapper
        self.param_schedulers = param_schedulers  # a list, or a dict of lists (MMEngine's)
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.val_evaluator = val_evaluator
        self.checkpointer = checkpointer
        self.hooks = hooks
        self.output = output
        self.log_interval = log_interval
        self.state = state
        self.last_val: dict[str, Any] = {}
        self._next_tick = 0
        self._step = train_step
        self._lr_group = first_param_group(optim_wrapper)
        self._stop = StopRequest(stop_policy, world_size=env.world_size, rank=env.rank,
                                 device=env.device)
        # A resumed run does not re-save the checkpoint it started from.
        self._saved_at: int | None = state.iter if state.resumed_from else None
        self._saved_path: Any = state.resumed_from
        # MMEngine's LoggerHook: an epoch's last, partial interval gets a line only so.
        self._log_last = not log_ignore_last or schedule.epoch_length <= log_interval
        # Where the data stands: passes over the train dataloader done, and the
        # iteration count at which the current pass would have begun.
        self._data_pass = state.data_pass
        self._pass_origin = state.iter - state.batch_idx
        self._train_rng: dict[str, Any] | None = None  # set while validating
        per_rank = per_rank_batch(train_dataloader)
        self._global_batch = per_rank * env.world_size if per_rank else None
        self._checkpoint_hooks = ([h for h in hooks.hooks if isinstance(h, BuiltinCheckpointHook)]
                                  if checkpointer is not None else [])
        # MMEngine's RuntimeInfoHook puts each iteration's outputs into the message
        # hub (a device sync each); only for hooks that may read them.
        self._hub_every_iter = any(_may_read_outputs(fn) for fn in hooks.after_train_iter)

    # -- the run ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``max_iters``; returns the final metrics."""
        s, hooks, runner, out = self.schedule, self.hooks, self.hooks.runner, self.output
        it, skip = self.state.iter, self.state.batch_idx
        pending_rng = self.state.rng_state
        batch_idx = skip
        t0 = time.perf_counter()
        # Saved after an epoch's last batch, before its end: that end, and its
        # validation, run again now.
        ends_epoch_first = s.by_epoch and skip > 0 and skip == s.epoch_length
        out.open(it, resumed=self.state.resumed_from is not None,
                 repeats_evals=ends_epoch_first)
        for hook in self._checkpoint_hooks:
            hook.attach(self)
        try:
            self._stop.install()
            hooks.start_run()
            self.model.train()
            runner.epoch, runner.iter = self._epoch(), it
            runner.message_hub.update_info_dict(  # what MMEngine's RuntimeInfoHook records
                {"epoch": runner.epoch, "iter": it, "max_epochs": s.max_epochs,
                 "max_iters": s.max_iters})
            hooks.call("before_train")
            self.optim_wrapper.initialize_count_status(self.model, it, s.max_iters)
            self._next_tick = out.tick(it)
            if not s.by_epoch:
                hooks.call("before_train_epoch")
            while it < s.max_iters:
                if pending_rng is not None and s.by_epoch and skip == 0:
                    restore_rng(pending_rng)  # saved right after the previous epoch ended
                    pending_rng = None
                if s.by_epoch:
                    runner.epoch = self._data_pass
                    hooks.call("before_train_epoch")
                batches = epoch_batches(self.train_dataloader, self._data_pass, skip)
                if pending_rng is not None:
                    restore_rng(pending_rng)  # saved after batch `skip` of this pass
                    pending_rng = None
                it, batch_idx, stopped = self._iterate(batches, it, skip)
                if batch_idx == 0:
                    raise EmptyDatasetError(
                        f"train_dataloader yielded no batch in epoch {self._data_pass + 1}; "
                        f"check its dataset (an iterable dataset may be exhausted)")
                skip = 0
                if stopped and not s.by_epoch:
                    break  # max_iters reached in the middle of a pass over the data
                self._end_of_pass(it, batch_idx)
            if not s.by_epoch:
                out.flush(self._data_pass)  # the hub is current for every hook point
                runner.iter = it
                hooks.call("after_train_epoch")  # LOW: epoch schedulers; VERY_LOW: epoch_1
            out.tick(it)  # the bar ends at the last iteration, not at the last tick
            runner.iter = it
            if self.checkpointer is not None:
                self.checkpointer.finish_pending()  # a background save, before after_train
            hooks.call("after_train")
            hooks.end_run()
        finally:
            self._stop.uninstall()
            for hook in self._checkpoint_hooks:
                hook.detach()
            out.flush(self._data_pass)  # what an interrupted run trained on is recorded too
            out.close()
        return self._result(it, time.perf_counter() - t0)

    def _epoch(self) -> int:
        return self._data_pass if self.schedule.by_epoch else 0

    def _iterate(self, batches: Any, it: int, batch_idx: int) -> tuple[int, int, bool]:
        """Train on ``batches``; returns (iterations done, batch index, hit max_iters)."""
        runner = self.hooks.runner
        step = self._step
        keep, append_lr = self.output.keep, self.output.lrs.append
        group = self._lr_group
        before, after = self.hooks.before_train_iter, self.hooks.after_train_iter
        hub, hub_every_iter = runner.message_hub, self._hub_every_iter
        by_epoch = self.schedule.by_epoch
        stop = self._stop
        next_event = self._next_event(it, batch_idx)
        try:
            for data_batch in batches:
                runner.iter = it
                idx = batch_idx if by_epoch else it
                for fn in before:
                    fn(runner, batch_idx=idx, data_batch=data_batch)
                outputs = step(data_batch)
                keep(outputs)
                append_lr(group["lr"])
                if hub_every_iter:  # MMEngine's RuntimeInfoHook
                    hub.update_info("iter", it)
                    for key, value in outputs.items():
                        hub.update_scalar(f"train/{key}", value)
                for fn in after:
                    fn(runner, batch_idx=idx, data_batch=data_batch, outputs=outputs)
                it += 1
                batch_idx += 1
                if it >= next_event or stop.pending:
                    if self._on_event(it, batch_idx):
                        return it, batch_idx, True
                    next_event = self._next_event(it, batch_idx)
        except BaseException:
            runner.iter = it  # where it failed, for the report of a failed rank
            raise
        return it, batch_idx, False

    # -- events ---------------------------------------------------------------------------
    def _next_event(self, it: int, batch_idx: int) -> int:
        """The next iteration count at which anything besides training happens."""
        s = self.schedule
        candidates = [s.max_iters, self._next_log(it, batch_idx), self._next_tick]
        if not s.by_epoch and self.val_dataloader is not None:
            candidates.append(_next_multiple(max(it, s.val_begin - 1), s.val_interval))
        stop_check = self._stop.next_check(it)
        if stop_check is not None:
            candidates.append(stop_check)
        return min(candidates)

    def _next_log(self, it: int, batch_idx: int) -> int:
        """MMEngine's LoggerHook: every ``interval`` batches of the epoch (an iteration
        loop is one epoch), and the epoch's last batch if ``_log_last``."""
        k = self.log_interval
        if self.schedule.by_epoch:
            return it - batch_idx + _next_multiple(batch_idx, k)  # the end: _end_of_pass
        length = self.schedule.epoch_length
        if self._log_last and it < length and length % k:
            return min(_next_multiple(it, k), length)  # MMEngine compares the global index
        return _next_multiple(it, k)

    def _log_due(self, it: int, batch_idx: int) -> bool:
        if self.schedule.by_epoch:
            return batch_idx % self.log_interval == 0
        return it % self.log_interval == 0 or (self._log_last
                                               and it == self.schedule.epoch_length)

    def _on_event(self, it: int, batch_idx: int) -> bool:
        """Handle whatever is due after ``it`` iterations; True when training is done."""
        self.hooks.runner.iter = it  # as MMEngine: the count, once the iteration is over
        if self._log_due(it, batch_idx):
            self.output.log(it, self._data_pass, batch_idx)
        if it >= self._next_tick:
            self._next_tick = self.output.tick(it)
        if self.val_dataloader is not None and self.schedule.val_due_after_iter(it):
            self._validate(it, shown_epoch=self._data_pass + 1)
        signum = self._stop.due(it)
        if signum and it < self.schedule.max_iters:  # on the last one, just finish
            self._stop_here(signum, it)
        return it >= self.schedule.max_iters

    def _end_of_pass(self, it: int, batch_idx: int) -> None:
        """A pass over the data ended: in epoch mode, the epoch's hooks and validation."""
        s, hooks, runner = self.schedule, self.hooks, self.hooks.runner
        if s.by_epoch and batch_idx % self.log_interval and self._log_last:
            self.output.log(it, self._data_pass, batch_idx)
        self.output.end_pass(self._data_pass)  # its records carry this pass's number
        self._data_pass += 1
        self._pass_origin = it
        if not s.by_epoch:
            return  # an iteration loop is one epoch to hooks: runner.epoch stays 0
        runner.iter = it
        hooks.call("after_train_epoch")  # LOW: epoch schedulers; VERY_LOW: epoch checkpoint
        runner.epoch = self._data_pass
        runner.message_hub.update_info("epoch", self._data_pass)
        if self.val_dataloader is not None and s.val_due_after_epoch(self._data_pass):
            self._validate(it, shown_epoch=self._data_pass)

    def _validate(self, it: int, *, shown_epoch: int) -> None:
        """One validation pass, on a fork of the RNG streams (see the module docstring)."""
        self.output.flush(self._data_pass)
        self._train_rng = capture_rng()
        try:
            metrics = run_evaluation(mode="val", model=self.model,
                                     dataloader=self.val_dataloader,
                                     evaluator=self.val_evaluator, hooks=self.hooks,
                                     env=self.env)
        finally:
            restore_rng(self._train_rng)
            self._train_rng = None
        self.last_val = dict(metrics)
        self.output.eval_metrics(metrics, mode="val", iters_done=it, epoch=shown_epoch)

    # -- checkpoints (called by the built-in checkpoint hook) ------------------------------
    def save_checkpoint(self, stem: str, *, epoch: int, iteration: int,
                        best: bool = False) -> Path:
        """Save the state after ``iteration`` iterations as ``stem``; returns its path.

        A ``best`` checkpoint holds the weights only and is not pruned. During
        validation the RNG state recorded is the one training continues with.
        """
        # A resume from this checkpoint cuts metrics.jsonl back to it: its records first.
        self.output.flush(self._data_pass)
        hub = self.hooks.runner.message_hub
        info = {k: v for k, v in hub.runtime_info.items() if k.startswith(BEST_INFO_PREFIXES)}
        optim_wrapper = None if best else self.optim_wrapper
        checkpoint = self.checkpointer.snapshot(
            model=self.model, optim_wrapper=optim_wrapper,
            param_schedulers=None if best else self.param_schedulers, epoch=epoch,
            iteration=iteration, batch_idx=iteration - self._pass_origin,
            data_pass=self._data_pass, seed=self.env.seed, rng_state=self._train_rng,
            runtime_info=info, global_batch=self._global_batch)
        self.hooks.call("before_save_checkpoint", checkpoint=checkpoint)
        path = self.checkpointer.save(checkpoint, stem, model=self.model,
                                      optim_wrapper=optim_wrapper, keep=not best)
        if not best:
            self._saved_at, self._saved_path = iteration, path
        self.output.info(f"Saved checkpoint {path}")
        return path

    def _stop_here(self, signum: int, it: int) -> None:
        name = signal.Signals(signum).name
        self.output.info(f"{name}: stopping after iteration {it}")
        path = None
        if self.checkpointer is not None:
            if self._saved_at != it:
                self.save_checkpoint(f"iter_{it}", epoch=self._epoch(), iteration=it)
            self.checkpointer.finish_pending()  # a stop waits for the last save to complete
            path = str(self._saved_path)
        saved = f"saved {path}" if path else "nothing saved (no checkpointer)"
        raise TrainingStopped(
            f"stopped by {name} after iteration {it} of {self.schedule.max_iters}; {saved}",
            signal_name=name, iteration=it, checkpoint=path, rank=self.env.rank)

    def _result(self, it: int, seconds: float) -> dict[str, Any]:
        result: dict[str, Any] = {"iter": it, "epoch": self._epoch(), "time_s": seconds}
        result.update(self.output.last_values)
        result.update({f"val/{k}": v for k, v in self.last_val.items()})
        return result
