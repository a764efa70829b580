"""What a run shows and records: progress, log lines, ``metrics.jsonl``, and the scalars
the visualizer's backends receive (as MMEngine's LoggerHook hands them over).

On an accelerator each iteration's logged values stay on the device until the
next flush, so the loop does not wait for the device between log lines.
``metrics.jsonl`` holds every iteration's raw values. Only rank 0 writes or prints.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flexgraph.training.config import LogProcessorPolicy
from flexgraph.training.output._bar import TerminalBar, format_duration
from flexgraph.training.output._log_values import LogValues
from flexgraph.training.output._progress import Progress
from flexgraph.training.output._workdir import FILE_ONLY

METRICS_FILE = "metrics.jsonl"
# Redraws a second at most (rich's refresh thread stays off: it would take the
# interpreter's lock from the training thread), and the CPU share redrawing may take.
_REFRESH_PER_SECOND = 4
_BAR_CPU_SHARE = 0.005
_NEVER = 2**62


class _ScalarFiles:
    """The scalar files a ``LocalVisBackend`` writes in ``vis_data``, without building
    a Visualizer (which slows a run's start)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._files: dict[str, Any] = {}

    def add_scalars(self, scalar_dict: dict[str, float], step: int = 0,
                    file_path: str | None = None) -> None:
        line = json.dumps({**scalar_dict, "step": step}) + "\n"
        for name in ("scalars.json", file_path):
            if name:
                if name not in self._files:
                    self.folder.mkdir(parents=True, exist_ok=True)
                    self._files[name] = open(self.folder / name, "a", encoding="utf-8")  # noqa: SIM115
                self._files[name].write(line)
                self._files[name].flush()

    def close(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            f.close()


# metrics.jsonl's records: JSON without spaces (NaN and the infinities as ``json`` writes them)
_RECORD_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


def _numbers(values: list[Any]) -> list[dict[str, float]]:
    """Each kept value as ``{key: number}``, read in one go."""
    rows = [value if isinstance(value, Mapping) else {"loss": value} for value in values]
    numbers = iter(_to_floats([v for row in rows for v in row.values()]))
    return [{key: next(numbers) for key in row} for row in rows]


def _to_floats(values: list[Any]) -> list[float]:
    """Python floats of many numbers or scalar tensors (one stack, one device sync)."""
    if not values:
        return []
    if not isinstance(values[0], torch.Tensor):  # kept as numbers (on the CPU)
        return list(map(float, values))
    with torch.no_grad():
        try:
            return torch.stack(values).float().tolist()  # the common case: 0-dim, same dtype
        except (TypeError, RuntimeError):
            return torch.stack([
                (v if isinstance(v, torch.Tensor) else torch.tensor(float(v)))
                .detach().float().reshape(()).cpu() for v in values
            ]).tolist()


def _truncate_after(path: Path, last_iter: int, *, evals_at_last: bool = True) -> None:
    """Drop the records of iterations after ``last_iter`` (and, unless
    ``evals_at_last``, its evaluation records: a validation the resumed run repeats)."""
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
    work_dir
        Where ``metrics.jsonl`` goes.
    visualizer
        The run's Visualizer, closed by :meth:`close`; ``None``: scalars go to ``vis_dir``.
    vis_dir, timestamp
        Where the default visualizer's scalar files go, and the run's timestamp.
    log_processor
        The config's ``log_processor``.
    metric_by_epoch
        The LoggerHook's ``log_metric_by_epoch``.
    is_main
        Rank 0; other ranks write nothing.
    logger, message_hub
    log_interval, max_iters, max_epochs, by_epoch, epoch_length
        For log cadence, ETA and the ``Epoch(train) [e/E][i/N]`` prefix.
    interactive
        Force the progress bar on or off; default: stdout is a terminal.
    device
        Where the logged values live.
    progress
        The progress record each log line updates for the launcher, if any.
    """

    def __init__(self, *, work_dir: str, is_main: bool, logger: Any, message_hub: Any,
                 log_interval: int, max_iters: int, max_epochs: int, by_epoch: bool,
                 epoch_length: int, interactive: bool | None = None,
                 device: str = "cpu", visualizer: Any = None, vis_dir: str | None = None,
                 timestamp: str = "", log_processor: LogProcessorPolicy | None = None,
                 metric_by_epoch: bool = True, progress: Progress | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.is_main = is_main
        self.logger = logger
        self.message_hub = message_hub
        self.log_interval = log_interval
        self.max_iters = max_iters
        self.max_epochs = max_epochs
        self.by_epoch = by_epoch
        self.epoch_length = epoch_length
        self.visualizer = visualizer
        self.vis_dir = vis_dir
        self.metric_by_epoch = by_epoch and metric_by_epoch
        self.json_name = f"{timestamp or time.strftime('%Y%m%d_%H%M%S')}.json"
        processor = log_processor or LogProcessorPolicy()
        #: lines and scalars by epoch (``Epoch(train) [e/E][i/N]``, an ``epoch`` scalar)
        self.log_by_epoch = by_epoch if processor.by_epoch is None else processor.by_epoch
        self.digits = processor.num_digits
        self.log_values = LogValues(processor, epoch_length=epoch_length, by_epoch_loop=by_epoch)
        self.interactive = is_main and (sys.stdout.isatty() if interactive is None
                                        else interactive)
        #: per iteration since the last flush: the logged value (as :meth:`keep` keeps
        #: it) and the learning rate
        self.values: list[Any] = []
        self.lrs: list[float] = []
        on_cpu = torch.device(device).type == "cpu"
        self._convert = torch.Tensor.item if on_cpu else torch.Tensor.detach
        self._window_n = 0  # iterations flushed since the last log line
        self._last: dict[str, float] = {}
        self._jsonl: Any = None
        self._scalars: Any = None  # the visualizer, or _ScalarFiles (rank 0, once open)
        self._bar: TerminalBar | None = None
        self._pending: list[str] = []  # lines for above the bar, printed at the next tick
        self._start_iter = 0
        self._next_iter = 1
        self._t0 = self._t_tick = time.perf_counter()
        self._cpu_tick = time.process_time()
        self._redraw_cpu = 0.0  # what the last redraw took, in CPU seconds
        self._tick_iter = 0
        self._progress_record = progress  # for a launcher; None when alone

    # -- lifecycle ------------------------------------------------------------------
    def open(self, start_iter: int, *, resumed: bool = False,
             repeats_evals: bool = False) -> None:
        """Start timing at ``start_iter`` and open the sinks (rank 0).

        A resumed run first cuts ``metrics.jsonl`` back to ``start_iter``: what
        came after is trained again. With ``repeats_evals`` the validation record
        at ``start_iter`` goes too.
        """
        self._start_iter = self._tick_iter = start_iter
        self._next_iter = start_iter + 1
        self._t0 = self._t_tick = time.perf_counter()
        self._cpu_tick = time.process_time()
        if not self.is_main:
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if resumed:
            _truncate_after(self.work_dir / METRICS_FILE, start_iter,
                            evals_at_last=not repeats_evals)
        self._jsonl = open(self.work_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115
        self.log_values.watch(self.message_hub)
        if self.visualizer is not None:
            self._scalars = self.visualizer
        elif self.vis_dir is not None:
            self._scalars = _ScalarFiles(self.vis_dir)
        if self.interactive:
            self._bar = TerminalBar("train", self.max_iters)
            self._bar.start()

    def close(self) -> None:
        """Release the sinks and close the visualizer (call :meth:`flush` first); idempotent."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if isinstance(self._scalars, _ScalarFiles):
            self._scalars.close()
        self._scalars = None
        if self.visualizer is not None:
            self.visualizer.close()
            self.visualizer = None
        if self._bar is not None:
            self._redraw(self._bar.shown[0] if self._bar.shown else self._start_iter)
            self._bar.stop()
            self._bar = None

    # -- per iteration, and per flush --------------------------------------------------
    def keep(self, value: Any) -> None:
        """Keep one iteration's logged value: a loss, or a dict of values (the loss alone
        kept as a loss). Tensors become numbers on the CPU, detached tensors elsewhere."""
        if isinstance(value, Mapping):
            if len(value) != 1 or "loss" not in value:
                self.values.append({k: self._convert(v) if isinstance(v, torch.Tensor) else v
                                    for k, v in value.items()})
                return
            value = value["loss"]
        self.values.append(self._convert(value) if isinstance(value, torch.Tensor) else value)

    @property
    def last_values(self) -> dict[str, float]:
        return dict(self._last)

    def flush(self, epoch: int) -> None:
        """Record the iterations kept since the last flush (one device sync)."""
        values, lrs = self.values.copy(), self.lrs.copy()
        self.values.clear()  # in place: the loop holds the bound ``append``
        self.lrs.clear()
        first = self._next_iter
        self._next_iter += len(values)
        if not self.is_main or not values:
            return
        rows = _numbers(values)
        columns: dict[str, list[float]] = {}
        for row in rows:
            for key, number in row.items():
                columns.setdefault(key, []).append(number)
        for key, column in (*columns.items(), ("lr", lrs)):
            self.log_values.extend(key, column)
            self._last[key] = column[-1]
        self._window_n += len(values)
        self._write([{"iter": first + i, "epoch": epoch + 1, **row, "lr": lr}
                     for i, (row, lr) in enumerate(zip(rows, lrs, strict=True))])

    def end_pass(self, epoch: int) -> None:
        self.flush(epoch)

    def _write(self, records: list[dict[str, Any]]) -> None:
        if self._jsonl is not None:
            self._jsonl.write("".join(f"{_RECORD_ENCODER.encode(r)}\n" for r in records))
            self._jsonl.flush()

    def log(self, iters_done: int, epoch: int, batch_idx: int) -> None:
        """The log line due after ``iters_done`` iterations; every rank records its progress."""
        if self._progress_record is not None:
            self._progress_record.iteration(iters_done, self.log_interval)
        self.flush(epoch)
        if self.is_main and self._window_n:
            self._line(iters_done, batch_idx, epoch=epoch)

    def _line(self, iters_done: int, batch_idx: int, *, epoch: int) -> None:
        self._window_n = 0
        values = self.log_values.train(
            self.message_hub,
            epoch_window=batch_idx if self.by_epoch else iters_done, global_window=iters_done)
        for key in self.log_values.own(values):  # what the line says of flexgraph's keys
            self.message_hub.update_scalar(f"train/{key}", values[key])
        shown_epoch = epoch + 1 if self.by_epoch else 1  # MMEngine's runner.epoch + 1
        if self._scalars is not None:
            tags = self.log_values.scalars(values, "train")
            if self.log_by_epoch:
                tags["epoch"] = shown_epoch
            tags["iter"] = iters_done
            self._scalars.add_scalars(tags, step=iters_done, file_path=self.json_name)
        done = iters_done - self._start_iter
        per_iter = (time.perf_counter() - self._t0) / done if done else float("nan")
        eta = format_duration(per_iter * (self.max_iters - iters_done))
        if self.log_by_epoch:
            shown_batch = batch_idx if self.by_epoch else iters_done
            where = (f"Epoch(train) [{shown_epoch}/{self.max_epochs}]"
                     f"[{shown_batch:>{len(str(self.epoch_length))}}/{self.epoch_length}]")
        else:
            where = f"Iter(train) [{iters_done:>{len(str(self.max_iters))}}/{self.max_iters}]"
        digits = self.digits
        lrs = "  ".join(f"{k}: {v:.{digits}e}" for k, v in values.items() if k.endswith("lr"))
        shown = "  ".join(f"{k}: {v:.{digits}f}" for k, v in values.items()
                          if not k.endswith("lr"))
        self._print(f"{where}  {lrs}  eta: {eta}  time: {per_iter * 1e3:.2f} ms/it  {shown}")

    def tick(self, iters_done: int) -> int:
        """Redraw the progress bar; return the iteration count of the next tick."""
        if self._bar is None:
            return _NEVER
        wall, cpu = time.perf_counter(), time.process_time()
        done, self._tick_iter = iters_done - self._tick_iter, iters_done
        stride = 1.0
        if done > 0 and wall > self._t_tick:
            stride = done / ((wall - self._t_tick) * _REFRESH_PER_SECOND)
            if cpu > self._cpu_tick:
                stride = max(stride, done * self._redraw_cpu / ((cpu - self._cpu_tick)
                                                                * _BAR_CPU_SHARE))
        self._redraw(iters_done)
        self._t_tick, self._cpu_tick = time.perf_counter(), time.process_time()
        self._redraw_cpu = self._cpu_tick - cpu
        return iters_done + max(1, min(int(stride), 10_000))

    def _redraw(self, iters_done: int) -> None:
        elapsed = time.perf_counter() - self._t0
        done = iters_done - self._start_iter
        remaining = elapsed / done * (self.max_iters - iters_done) if done else float("nan")
        loss = self._last.get("loss")
        lines, self._pending = "\n".join(self._pending), []
        self._bar.show(iters_done, elapsed=elapsed, remaining=remaining,
                       status=f"loss {loss:.4f}" if loss is not None else "", lines=lines)

    # -- evaluation ---------------------------------------------------------------------
    def eval_metrics(self, metrics: Mapping[str, Any], *, mode: str, iters_done: int,
                     epoch: int) -> None:
        """Record one evaluation: in ``metrics.jsonl`` as computed; in the hub, the line and
        the backends (validation only) as MMEngine's RuntimeInfoHook and LoggerHook do."""
        if not self.is_main:
            return
        values = {k: _scalar(v) for k, v in metrics.items()}
        self._write([{"mode": mode, "iter": iters_done, "epoch": epoch, **values}])
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.message_hub.update_scalar(f"{mode}/{key}", value)
        logged = self.log_values.evaluation(self.message_hub, mode, epoch_window=iters_done + 1,
                                            global_window=iters_done + 1)
        if logged and mode == "val" and self._scalars is not None:
            self._scalars.add_scalars(self.log_values.scalars(logged, mode),
                                      step=epoch if self.metric_by_epoch else iters_done,
                                      file_path=self.json_name)
        shown = {**values, **logged}
        digits = self.digits
        text = "  ".join(f"{k}: {v:.{digits}f}" if isinstance(v, float) else f"{k}: {v}"
                         for k, v in shown.items())
        self._print(f"Epoch({mode}) [{epoch}]  {text}" if self.log_by_epoch
                    else f"Iter({mode}) [{iters_done}]  {text}")

    def info(self, message: str) -> None:
        if self.is_main:
            self._print(message)

    def _print(self, line: str) -> None:
        """A log line: to the logger, or above the progress bar with its next tick."""
        if self._bar is None:
            self.logger.info(line)
        elif self.logger.isEnabledFor(logging.INFO):
            self.logger.info(line, extra=FILE_ONLY)  # the console gets it with the next tick
            self._pending.append(line)
