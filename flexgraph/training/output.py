"""What a run shows and records: progress, log lines, metrics.jsonl, TensorBoard.

The loop hands this module two things per iteration, the logged value and the
learning rate, appended to :attr:`TrainOutput.values` and :attr:`TrainOutput.lrs`
without any conversion (two list appends: no tuple or dict for the garbage
collector to track). Everything that costs something (``.item()`` / ``.tolist()``
syncs, JSON encoding, file writes, TensorBoard, progress updates) happens in
:meth:`TrainOutput.flush`, which the loop calls at log intervals, epoch ends,
before validation and at the end. So on a GPU the loop never waits for a loss
value between log intervals.

Only rank 0 writes or prints. On a terminal, a rich progress bar with ETA is
updated at most about ten times a second (its own refresh rate); otherwise
plain log lines are printed every ``log_interval`` iterations.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.progress import progress_of_this_rank
from flexgraph.training.workdir import FILE_ONLY

__all__ = ["METRICS_FILE", "TrainOutput", "format_duration"]

METRICS_FILE = "metrics.jsonl"
_PENDING = object()  # a sink not made yet
_REFRESH_PER_SECOND = 4  # the bar's redraws (rich's default, 10, costs a fast loop 5%)
_TICK_SECONDS = 1 / _REFRESH_PER_SECOND  # updating the bar faster than it redraws is wasted
_TB_SECONDS = 10.0  # TensorBoard events go to its writer thread at most this often
_NEVER = 2**62


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` for ETAs."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _TensorBoard:
    """TensorBoard scalars, all of one step in a single event, handed over in batches.

    ``SummaryWriter.add_scalar`` writes one event per value, each a protobuf
    round and a wake-up of the writer thread; a log line's values share a step,
    so they go out together. Each hand-over wakes the writer's thread, which
    then competes with the training loop for the interpreter: on a short log
    interval that costs the loop several percent. So events are kept (with the
    wall time of their log line) and handed over every ``_TB_SECONDS`` and at
    :meth:`close`; the writer itself only flushes its file every two minutes,
    so the file a TensorBoard reads is no later for it.
    """

    def __init__(self, log_dir: Path) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter

        self._summary = Summary
        self._writer = SummaryWriter(log_dir=str(log_dir))
        self._pending: list[tuple[Mapping[str, float], int, float]] = []
        self._next_write = time.perf_counter() + _TB_SECONDS

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        self._pending.append((values, step, time.time()))
        if time.perf_counter() >= self._next_write:
            self._write()

    def _write(self) -> None:
        writer = self._writer._get_file_writer()
        for values, step, wall_time in self._pending:
            entries = [self._summary.Value(tag=tag, simple_value=float(value))
                       for tag, value in values.items()]
            writer.add_summary(self._summary(value=entries), step, walltime=wall_time)
        self._pending.clear()
        self._next_write = time.perf_counter() + _TB_SECONDS

    def close(self) -> None:
        self._write()
        self._writer.close()


def _tensorboard_writer(log_dir: Path) -> _TensorBoard | None:
    try:
        return _TensorBoard(log_dir)
    except ImportError:  # tensorboard not installed: scalars go to metrics.jsonl only
        return None


_LOSS_ONLY = ("loss",)
_LOSS_RECORD = '{"iter": %d, "epoch": %d, "loss": %r, "lr": %r}\n'
_LOSS_RECORD_TEXT = '{"iter": %d, "epoch": %d, "loss": %s, "lr": %s}\n'


@functools.lru_cache(maxsize=256)
def _json_key(key: str) -> str:
    return json.dumps(key)


@functools.lru_cache(maxsize=64)
def _record_template(keys: tuple[str, ...]) -> str:
    """``%``-format of a record with ``keys`` (finite values: ``%r`` is valid JSON)."""
    fields = "".join(f"{_json_key(key).replace('%', '%%')}: %r, " for key in keys)
    return '{"iter": %d, "epoch": %d, ' + fields + '"lr": %r}\n'


def _same_keys(values: list[Any]) -> tuple[str, ...] | None:
    """The keys every value has, when all are mappings with the same keys; else None."""
    first = values[0]
    if not isinstance(first, Mapping):
        return None
    keys = first.keys()
    for value in values:
        if not isinstance(value, Mapping) or value.keys() != keys:
            return None
    return tuple(keys)


def _json_number(value: float) -> str:
    """Like ``json.dumps`` for a float (NaN / Infinity included), without its overhead."""
    return repr(value) if math.isfinite(value) else json.dumps(value)


def _to_floats(values: list[Any]) -> list[float]:
    """Python floats of many scalar tensors, with one stack and one device sync."""
    with torch.no_grad():
        try:
            return torch.stack(values).float().tolist()  # the common case: 0-dim, same dtype
        except (TypeError, RuntimeError):
            return torch.stack([
                (v if isinstance(v, torch.Tensor) else torch.tensor(float(v)))
                .detach().float().reshape(()).cpu() for v in values
            ]).tolist()


def _truncate_after(path: Path, last_iter: int, *, evals_at_last: bool = True) -> None:
    """Drop the records of iterations after ``last_iter`` (records are in order).

    ``evals_at_last=False`` also drops evaluation records at ``last_iter``
    (written after the checkpoint, by a validation the resumed run repeats).
    """
    if not path.is_file():
        return
    with open(path, "r+b") as f:
        offset = 0
        for line in f:
            try:
                record = json.loads(line)
                done = record.get("iter", 0)
                if done > last_iter or (done == last_iter and "mode" in record
                                        and not evals_at_last):
                    break
            except (ValueError, AttributeError):
                break  # a torn last line from a crash
            offset += len(line)
        f.truncate(offset)


def _scalar(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


class TrainOutput:
    """Progress display and metric sinks of one ``train`` / ``val`` / ``test`` run.

    Parameters
    ----------
    work_dir:
        ``metrics.jsonl`` and ``tensorboard/`` go here (rank 0 only).
    is_main:
        Rank 0; other ranks keep the buffer short and write nothing.
    logger, message_hub:
        The run's MMEngine logger and message hub (the hub receives interval
        means, as MMEngine's LoggerHook would leave them).
    log_interval, max_iters, max_epochs, by_epoch, epoch_length:
        For log cadence, ETA and the ``Epoch(train) [e/E][i/N]`` prefix.
    interactive:
        Force the rich progress bar on or off; default: stdout is a terminal.
    """

    def __init__(self, *, work_dir: str, is_main: bool, logger: Any, message_hub: Any,
                 log_interval: int, max_iters: int, max_epochs: int, by_epoch: bool,
                 epoch_length: int, interactive: bool | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.is_main = is_main
        self.logger = logger
        self.message_hub = message_hub
        self.log_interval = log_interval
        self.max_iters = max_iters
        self.max_epochs = max_epochs
        self.by_epoch = by_epoch
        self.epoch_length = epoch_length
        self.interactive = is_main and (sys.stdout.isatty() if interactive is None
                                        else interactive)
        #: per iteration since the last flush: the logged value (a loss tensor or a
        #: dict of them) and the learning rate; the loop appends to both
        self.values: list[Any] = []
        self.lrs: list[float] = []
        self._window: dict[str, list[float]] = {}  # sums and counts since the last log line
        self._window_n = 0
        self._last: dict[str, float] = {}
        self._jsonl: Any = None
        self._tb: Any = None
        self._progress: Any = None
        self._task: Any = None
        self._pending: list[str] = []  # lines for above the bar, printed at the next tick
        self._start_iter = 0
        self._next_iter = 1
        self._t0 = time.perf_counter()
        self._tick_every = 1
        self._t_tick = self._t0
        self._progress_record = progress_of_this_rank()  # for a launcher; None when alone

    # -- lifecycle ------------------------------------------------------------------
    def open(self, start_iter: int, *, resumed: bool = False,
             repeats_evals: bool = False) -> None:
        """Start timing at ``start_iter`` and open the sinks (rank 0).

        A resumed run first cuts ``metrics.jsonl`` back to ``start_iter``: the
        records an interrupted run wrote after its checkpoint describe steps
        that were rolled back and are about to be trained (and logged) again.
        ``repeats_evals``: the run repeats the validation at ``start_iter`` too
        (the checkpoint was saved before its epoch's end), so its record goes.
        """
        self._start_iter = start_iter
        self._next_iter = start_iter + 1
        self._t0 = self._t_tick = time.perf_counter()
        if not self.is_main:
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if resumed:
            _truncate_after(self.work_dir / METRICS_FILE, start_iter,
                            evals_at_last=not repeats_evals)
        # Open for the whole run (closed in close()), so each flush is one write.
        self._jsonl = open(self.work_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        self._tb = _PENDING  # made on first use: importing tensorboard delays the first step
        if self.interactive:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                TextColumn("{task.fields[status]}"), transient=False,
                refresh_per_second=_REFRESH_PER_SECOND)
            self._task = self._progress.add_task(
                "train", total=self.max_iters, completed=start_iter, status="")
            self._progress.start()

    def close(self) -> None:
        """Release the sinks (call :meth:`flush` first); safe to call twice."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None and self._tb is not _PENDING:
            self._tb.close()
        self._tb = None
        if self._progress is not None:
            self._print_pending()
            self._progress.stop()
            self._progress = None

    def _board(self) -> _TensorBoard | None:
        """The TensorBoard writer (``None`` without tensorboard), made on first use."""
        if self._tb is _PENDING:
            self._tb = _tensorboard_writer(self.work_dir / "tensorboard")
        return self._tb

    # -- per-interval work ----------------------------------------------------------------
    @property
    def last_values(self) -> dict[str, float]:
        """The most recent value of every logged key (and ``lr``)."""
        return dict(self._last)

    def flush(self, epoch: int) -> None:
        """Convert and write the buffered iterations (of epoch index ``epoch``).

        Records are numbered on from the last flushed one. All buffered loss
        tensors are converted with one ``stack().tolist()``, so a flush costs one
        device sync however many iterations it covers.
        """
        values, lrs = self.values.copy(), self.lrs.copy()
        self.values.clear()  # in place: the loop holds the bound ``append`` methods
        self.lrs.clear()
        first = self._next_iter
        self._next_iter += len(values)
        if not values or not self.is_main:
            return
        if any(isinstance(value, Mapping) for value in values):
            lines = self._records_with_keys(values, lrs, first, epoch + 1)
        else:
            lines = self._loss_records(values, lrs, first, epoch + 1)
        self._last["lr"] = lrs[-1]
        self._window_n += len(values)
        if self._jsonl is not None:
            self._jsonl.write("".join(lines))
            self._jsonl.flush()

    def _loss_records(self, values: list[Any], lrs: list[float], first: int,
                      epoch: int) -> list[str]:
        """The common case, one loss per iteration: one line per record, no dicts."""
        losses = _to_floats(values)
        acc = self._window.setdefault("loss", [0.0, 0])
        acc[0] += math.fsum(losses)
        acc[1] += len(losses)
        self._last["loss"] = losses[-1]
        iters = range(first, first + len(losses))
        if all(map(math.isfinite, losses + lrs)):  # %r of a finite float is valid JSON
            return [_LOSS_RECORD % fields
                    for fields in zip(iters, itertools.repeat(epoch), losses, lrs)]
        return [_LOSS_RECORD_TEXT % (i, epoch, _json_number(loss), _json_number(lr))
                for i, loss, lr in zip(iters, losses, lrs, strict=True)]

    def _records_with_keys(self, values: list[Any], lrs: list[float], first: int,
                           epoch: int) -> list[str]:
        """Iterations that logged several values (dict losses, MMEngine log_vars)."""
        keys = _same_keys(values)
        if keys is not None:
            lines = self._columns(keys, values, lrs, first, epoch)
            if lines is not None:
                return lines
        flat: list[Any] = []
        layout: list[tuple[str, ...]] = []
        for value in values:
            if isinstance(value, Mapping):
                keys = tuple(value)
                layout.append(keys)
                flat.extend(value[k] for k in keys)
            else:
                layout.append(_LOSS_ONLY)
                flat.append(value)
        numbers = iter(_to_floats(flat))
        lines = []
        window, last = self._window, self._last
        for i, (keys, lr) in enumerate(zip(layout, lrs, strict=True)):
            fields = [f'"iter": {first + i}, "epoch": {epoch}']
            for key in keys:
                number = next(numbers)
                fields.append(f"{_json_key(key)}: {_json_number(number)}")
                acc = window.get(key)
                if acc is None:
                    acc = window[key] = [0.0, 0]
                acc[0] += number
                acc[1] += 1
                last[key] = number
            fields.append(f'"lr": {_json_number(lr)}')
            lines.append("{" + ", ".join(fields) + "}\n")
        return lines

    def _columns(self, keys: tuple[str, ...], values: list[Any], lrs: list[float], first: int,
                 epoch: int) -> list[str] | None:
        """Every iteration logged the same keys (MMEngine's log_vars do): one column
        per key and one format per line; ``None`` when a value is not finite."""
        numbers = _to_floats([value[key] for value in values for key in keys])
        if not (all(map(math.isfinite, numbers)) and all(map(math.isfinite, lrs))):
            return None  # the general path spells NaN and Infinity as JSON does
        columns = [numbers[j::len(keys)] for j in range(len(keys))]
        for key, column in zip(keys, columns, strict=True):
            acc = self._window.setdefault(key, [0.0, 0])
            acc[0] += math.fsum(column)
            acc[1] += len(column)
            self._last[key] = column[-1]
        rows = zip(range(first, first + len(values)), itertools.repeat(epoch), *columns, lrs)
        template = _record_template(keys)
        return [template % row for row in rows]

    def log(self, iters_done: int, epoch: int, batch_idx: int) -> None:
        """Print one line (means over the interval), update TensorBoard and the hub.

        Every rank passes here, so it is also where a launched rank records how
        far it got (see :mod:`flexgraph.training.progress`): once per log line,
        never per iteration.
        """
        self.flush(epoch)
        if self._progress_record is not None:
            self._progress_record.iteration(iters_done, self.log_interval)
        if not self.is_main or not self._window_n:
            return
        means = {k: s / n for k, (s, n) in self._window.items() if n}
        self._window, self._window_n = {}, 0
        lr = self._last.get("lr", float("nan"))
        scalars = {f"train/{key}": value for key, value in means.items()}
        scalars["train/lr"] = lr
        for tag, value in scalars.items():
            self.message_hub.update_scalar(tag, value)
        if self._board() is not None:
            self._tb.scalars(scalars, iters_done)
        done = iters_done - self._start_iter
        elapsed = time.perf_counter() - self._t0
        per_iter = elapsed / done if done else float("nan")
        eta = format_duration(per_iter * (self.max_iters - iters_done))
        if self.by_epoch:
            where = (f"Epoch(train) [{epoch + 1}/{self.max_epochs}]"
                     f"[{batch_idx:>{len(str(self.epoch_length))}}/{self.epoch_length}]")
        else:
            where = f"Iter(train) [{iters_done:>{len(str(self.max_iters))}}/{self.max_iters}]"
        losses = "  ".join(f"{k}: {v:.4f}" for k, v in means.items())
        line = (f"{where}  lr: {lr:.4e}  eta: {eta}  time: {per_iter * 1e3:.2f} ms/it  "
                f"{losses}")
        self._print(line)

    def tick(self, iters_done: int) -> int:
        """Update the progress bar; return the iteration count of the next tick.

        The stride adapts so that ticks come about once per redraw of the bar
        (``_TICK_SECONDS``): a fast loop pays one progress update per redraw,
        not per step.
        """
        if self._progress is None:
            return _NEVER
        now = time.perf_counter()
        elapsed, self._t_tick = now - self._t_tick, now
        per_iter = elapsed / max(self._tick_every, 1)
        self._tick_every = max(1, min(int(_TICK_SECONDS / per_iter) if per_iter > 0 else 1,
                                      10_000))
        loss = self._last.get("loss")
        status = f"loss {loss:.4f}" if loss is not None else ""
        self._progress.update(self._task, completed=iters_done, status=status)
        self._print_pending()
        return iters_done + self._tick_every

    # -- evaluation ---------------------------------------------------------------------
    def eval_metrics(self, metrics: Mapping[str, Any], *, mode: str, iters_done: int,
                     epoch: int) -> None:
        """Record one evaluation: a ``"mode": mode`` line, TensorBoard, hub, log line."""
        if not self.is_main:
            return
        values = {k: _scalar(v) for k, v in metrics.items()}
        if self._jsonl is not None:
            record = {"mode": mode, "iter": iters_done, "epoch": epoch, **values}
            self._jsonl.write(json.dumps(record, default=str) + "\n")
            self._jsonl.flush()
        scalars = {f"{mode}/{key}": value for key, value in values.items()
                   if isinstance(value, (int, float))}
        for tag, value in scalars.items():
            self.message_hub.update_scalar(tag, value)
        if scalars and self._board() is not None:
            self._tb.scalars(scalars, iters_done)
        shown = "  ".join(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}"
                          for k, v in values.items())
        self._print(f"Epoch({mode}) [{epoch}]  {shown}" if self.by_epoch
                    else f"Iter({mode}) [{iters_done}]  {shown}")

    def info(self, message: str) -> None:
        """A one-off line (resume notices, the final summary), rank 0 only."""
        if self.is_main:
            self._print(message)

    def _print(self, line: str) -> None:
        """A log line: to the logger, or above the progress bar with its next tick.

        Printing above a live bar redraws the bar (about half a millisecond);
        the lines of one tick go out together, so a short log interval costs one
        redraw per tick, not one per line. The log level applies either way, and
        the log file gets every line when it is said.
        """
        if self._progress is None:
            self.logger.info(line)
        elif self.logger.isEnabledFor(logging.INFO):
            self.logger.info(line, extra=FILE_ONLY)  # the console gets it with the next tick
            self._pending.append(line)

    def _print_pending(self) -> None:
        if self._pending:
            lines, self._pending = "\n".join(self._pending), []
            self._progress.console.print(lines, highlight=False, markup=False)
