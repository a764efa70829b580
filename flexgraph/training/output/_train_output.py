"""What a run shows and records: progress, log lines, metrics.jsonl, and the scalars
that the visualizer's backends receive (as MMEngine's LoggerHook hands them over).

The loop hands this module two things per iteration, the logged value
(through :attr:`TrainOutput.keep`) and the learning rate (appended to
:attr:`TrainOutput.lrs`). On an accelerator ``keep`` appends the value detached
from its graph, so the loop never waits for the device; on the CPU it keeps
plain numbers (``.item()``, which costs no more than keeping the tensor there:
holding a few hundred small tensors between log lines fragments the heap every
step's temporaries come from, which cost a 0.3 ms step 2%).

Everything that costs something (``.tolist()`` syncs, JSON encoding, file
writes, the backends' scalars, progress updates) happens in :meth:`TrainOutput.flush`,
which runs with the log lines (see :meth:`TrainOutput.log`), before any hook
that may read the hub, before validation and checkpoints, and at the end. So
on a GPU the loop never waits for a loss value between log lines.

The per-iteration records of ``metrics.jsonl`` are formatted and written in
batches, every ``_RECORDS_SECONDS`` and whenever a checkpoint is about to be
saved (:meth:`TrainOutput.write_records`), not at every log line: work done
once every few seconds stays warm in the CPU's caches, while the same work
spread over every log line pays for cold caches each time. A resume cuts the
file back to its checkpoint anyway, so the records a crash can lose (those
after the last checkpoint, at most a few seconds of them) are ones a resume
would drop.

What a log line says for each key is what MMEngine's LoggerHook logs: its
``log_processor``'s statistics (:mod:`flexgraph.training.output._log_values`):
by default the mean over the last 10 iterations for the losses, the latest
value for ``lr``. The console, the log file and every backend of the run's
visualizer (``runner.visualizer``: its ``LocalVisBackend``'s ``scalars.json``,
TensorBoard, Weights & Biases, MLflow, ...) get those values, under MMEngine's
LoggerHook's tags and steps (see :class:`_ScalarHandOver`); without a
``visualizer`` in the config, flexgraph writes the ``scalars.json`` (and
``{timestamp}.json``) that MMEngine's default one would, without building it.
``metrics.jsonl`` is flexgraph's own record and keeps every iteration's raw
values (a loss as the step returned it, not a window's mean): the
statistics of any window can be computed from it, and a resume cuts it back
to the checkpoint's iteration.

Only rank 0 writes or prints. On a terminal, a progress bar with ETA
(:mod:`flexgraph.training.output._bar`) is redrawn by the loop about
``_REFRESH_PER_SECOND`` times a second (and after each iteration that takes
longer), but never so often that its redraws take more than
``_BAR_CPU_SHARE`` of the process's CPU time, with the log lines above it;
otherwise the log lines alone are printed.
Either way a line is due every ``log_interval`` iterations and says what it
would have said then; lines due within ``_LINES_SECONDS`` of each other go out
together.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import torch

from flexgraph.training.config import LogProcessorPolicy
from flexgraph.training.output._bar import TerminalBar, format_duration
from flexgraph.training.output._log_values import LogValues
from flexgraph.training.output._progress import Progress
from flexgraph.training.output._workdir import FILE_ONLY

__all__ = ["METRICS_FILE", "TrainOutput"]

METRICS_FILE = "metrics.jsonl"
# The bar is redrawn by the loop's ticks, about this often, and by nothing else:
# rich's own refresh thread (10 a second by default) costs a fast loop several
# percent, most of it in taking the interpreter's lock from the training thread.
_REFRESH_PER_SECOND = 4
_TICK_SECONDS = 1 / _REFRESH_PER_SECOND
# A redraw costs about 1 ms of CPU (rich's Live, cold in the caches after the
# steps). At 4 a second that is 0.4% of a process that has its CPU to itself,
# but the share grows as the CPU is shared: at half a CPU the loop benchmark's
# terminal run read 1.057 against 1.014 without a terminal. So ticks also
# wait for enough training CPU time to keep the redraws under this share.
_BAR_CPU_SHARE = 0.005
_HANDOVER_SECONDS = 10.0  # the visualizer's backends get their scalars at most this often
_RECORDS_SECONDS = 5.0  # metrics.jsonl gets the per-iteration records at least this often
_LINES_SECONDS = _TICK_SECONDS  # log lines due within this are composed and printed together
_NEVER = 2**62


class _ScalarHandOver:
    """Scalars for the visualizer's backends, kept and handed over in batches.

    What MMEngine's LoggerHook hands to ``runner.visualizer.add_scalars``: after
    a log line, the line's values, ``epoch`` (when the log processor logs by
    epoch) and ``iter``, without the ``train/`` prefix (unless
    ``log_with_hierarchy``) at step = iterations done; after a validation,
    its scalars at step = epochs done (epoch-based loops, MMEngine's
    ``log_metric_by_epoch``) or iterations done. Each backend gets them
    through its own ``add_scalars`` (a ``LocalVisBackend`` also into
    ``{timestamp}.json``, as the LoggerHook asks), except a
    ``TensorboardVisBackend``, whose values of one step become one event, at
    the wall time of their log line (``add_scalars`` writes an event per
    value, each a protobuf round and a wake-up of the writer thread, at the
    time of the hand-over), and :class:`_ScalarFiles`, the default
    visualizer's files.

    A hand-over wakes the backends' threads, which then compete with the
    training loop for the interpreter: on a short log interval that costs the
    loop several percent. So scalars are kept and handed over every
    ``_HANDOVER_SECONDS`` and at :meth:`close`; TensorBoard's writer flushes its
    file only every two minutes anyway.
    """

    def __init__(self, backends: list[Any], json_name: str) -> None:
        self._backends = backends
        self._json_name = json_name
        self._pending: list[tuple[dict[str, float], int, float]] = []
        self._next_write = time.perf_counter() + _HANDOVER_SECONDS

    def scalars(self, values: dict[str, float], step: int,
                wall_time: float | None = None) -> None:
        self._pending.append((values, step, time.time() if wall_time is None else wall_time))
        if time.perf_counter() >= self._next_write:
            self.hand_over()

    def hand_over(self) -> None:
        batch, self._pending = self._pending, []
        if batch:
            for backend in self._backends:
                _write_scalars(backend, batch, self._json_name)
        self._next_write = time.perf_counter() + _HANDOVER_SECONDS

    def close(self) -> None:
        """Hand over what is kept, then close the scalar files (the visualizer's
        backends are closed with the visualizer)."""
        self.hand_over()
        for backend in self._backends:
            if isinstance(backend, _ScalarFiles):
                backend.close()


class _ScalarFiles:
    """The scalar files MMEngine's default visualizer (a ``LocalVisBackend``) writes in
    ``vis_data``: ``scalars.json`` and the LoggerHook's ``{timestamp}.json``, one
    JSON object a line with its ``step``, written here without building it (a
    Visualizer costs a run's start half a second).

    Both files are opened at the first hand-over and stay open until :meth:`close`;
    each hand-over is then a write and a flush per file (opening and closing
    both made up a quarter of a log line's cost where every line was handed
    over at once: the loop benchmark's runs under callgrind)."""

    def __init__(self, folder: str | Path, json_name: str) -> None:
        self.folder, self.json_name = Path(folder), json_name
        self._files: list[Any] = []

    def write(self, batch: list[tuple[dict[str, float], int, float]]) -> None:
        text = "".join(json.dumps({**values, "step": step}) + "\n" for values, step, _ in batch)
        if not self._files:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._files = [open(self.folder / name, "a", encoding="utf-8")  # noqa: SIM115
                           for name in ("scalars.json", self.json_name)]
        for f in self._files:
            f.write(text)
            f.flush()

    def close(self) -> None:
        files, self._files = self._files, []
        for f in files:
            f.close()


def _scalar_backends(visualizer: Any, vis_dir: str | None, json_name: str) -> list[Any]:
    """What gets the scalars: every backend of ``visualizer``; without one, the files
    MMEngine's default visualizer would write in ``vis_dir`` (if any)."""
    if visualizer is None:
        return [_ScalarFiles(vis_dir, json_name)] if vis_dir is not None else []
    return list(getattr(visualizer, "_vis_backends", {}).values())  # MMEngine's, by name


def _write_scalars(backend: Any, batch: list[tuple[dict[str, float], int, float]],
                   json_name: str) -> None:
    """Hand ``batch`` (values, step, wall time) to one backend."""
    if isinstance(backend, _ScalarFiles):  # no Visualizer was built: import none of it
        backend.write(batch)
        return
    from mmengine.visualization import LocalVisBackend, TensorboardVisBackend

    if type(backend) is TensorboardVisBackend:  # a subclass may write otherwise: its own way
        _tensorboard_events(backend.experiment, batch)
    elif isinstance(backend, LocalVisBackend):
        for values, step, _ in batch:
            backend.add_scalars(dict(values), step=step, file_path=json_name)
    else:
        for values, step, _ in batch:
            backend.add_scalars(dict(values), step=step)


def _tensorboard_events(writer: Any, batch: list[tuple[dict[str, float], int, float]]) -> None:
    """One event per step on a ``SummaryWriter``: what ``add_scalar`` writes per value."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    events = writer._get_file_writer()
    for values, step, wall_time in batch:
        entries = [Summary.Value(tag=tag, simple_value=float(value))
                   for tag, value in values.items()]
        events.add_summary(Summary(value=entries), step, walltime=wall_time)


_LOSS_ONLY = ("loss",)


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


def _column_records(keys: tuple[str, ...], first: int, epoch: int,
                    columns: list[list[float]], lrs: list[float]) -> list[bytes]:
    """One line per iteration ``first, first + 1, ...``: ``keys`` from ``columns``, and lr.

    orjson writes a record in about a third of the instructions that ``json`` and
    Python's ``repr`` take (a float's shortest digits by Ryu, not by dtoa's big
    numbers): under callgrind, 6,800 instructions a record against 19,000, where the
    whole loop executed 38,000 an iteration more than a hand-written one. It writes
    NaN and the infinities as ``null``, so a stretch holding one is written by
    :func:`_record_line`.
    """
    iters = range(first, first + len(lrs))
    if all(all(map(math.isfinite, column)) for column in (*columns, lrs)):
        dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
        if keys == _LOSS_ONLY:  # the common case, in a third fewer instructions than zip's
            return [dumps({"iter": i, "epoch": epoch, "loss": loss, "lr": lr}, option=newline)
                    for i, loss, lr in zip(iters, columns[0], lrs, strict=True)]
        names = ("iter", "epoch", *keys, "lr")
        return [dumps(dict(zip(names, row, strict=True)), option=newline)
                for row in zip(iters, itertools.repeat(epoch), *columns, lrs)]
    return [_record_line(row[0], epoch, zip(keys, row[1:-1], strict=True), row[-1])
            for row in zip(iters, *columns, lrs, strict=True)]


def _record_line(iteration: int, epoch: int, items: Any, lr: float) -> bytes:
    """One record in the general spelling (NaN and Infinity as JSON writes them)."""
    return _json_line({"iter": iteration, "epoch": epoch, **dict(items), "lr": lr})


def _json_line(record: Mapping[str, Any]) -> bytes:
    """``record`` as a line of ``json``, spaced as orjson spaces it (not at all)."""
    return json.dumps(record, default=str, separators=(",", ":")).encode() + b"\n"


def _to_floats(values: list[Any]) -> list[float]:
    """Python floats of many numbers or scalar tensors (one stack, one device sync)."""
    if type(values[0]) is not torch.Tensor:  # kept as numbers (on the CPU)
        return list(map(float, values))
    with torch.no_grad():
        try:
            return torch.stack(values).float().tolist()  # the common case: 0-dim, same dtype
        except (TypeError, RuntimeError):
            return torch.stack([
                (v if isinstance(v, torch.Tensor) else torch.tensor(float(v)))
                .detach().float().reshape(()).cpu() for v in values
            ]).tolist()


def _keeper(values: list[Any], convert: Any) -> Any:
    """Append a logged value (a tensor, a dict of them) to ``values``, ``convert``-ed:
    ``Tensor.item`` (Python numbers) or ``Tensor.detach`` (no graph).

    A dict holding only ``loss`` (what MMEngine's ``BaseModel.train_step`` returns
    for a single loss) is kept as that loss alone, which is what a bare loss
    is recorded as: the same records and scalars, without a new dict per
    iteration. Dicts are told by their exact type first, so that the
    ``Mapping`` check (an ABC's, slow on a cold cache) runs only for other
    mappings: the step just evicted this code from the caches. Timed inside
    the model-API loop, keeping the value took 4.0 us before, 2.1 to 2.4 us
    now, against a hand loop's 1.3 us (``.item()`` and an append). What it
    reads every call is bound in its closure (no global or attribute lookups).
    """
    append, tensor = values.append, torch.Tensor

    def keep(value: Any) -> None:
        kind = type(value)
        if kind is tensor:
            append(convert(value))
        elif kind is OrderedDict or kind is dict or isinstance(value, Mapping):
            loss = value.get("loss") if len(value) == 1 else None
            if type(loss) is tensor:
                append(convert(loss))
            else:
                append({k: convert(v) if isinstance(v, tensor) else v for k, v in value.items()})
        else:
            append(value)

    return keep


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
    work_dir
        ``metrics.jsonl`` goes here (rank 0 only).
    visualizer
        The run's MMEngine Visualizer (``runner.visualizer``): its backends get
        the scalars (see the module docstring), and :meth:`close` closes it, as
        MMEngine's LoggerHook does after the run. ``None`` when none was
        built: then the scalars go to ``vis_dir``.
    vis_dir, timestamp
        Where MMEngine's default visualizer would write its scalar files
        (``runner.log_dir``'s ``vis_data``; ``None``: nowhere), and the run's
        timestamp, which names its ``{timestamp}.json``.
    log_processor
        The config's ``log_processor``: what a line says for each key.
    metric_by_epoch
        The LoggerHook's ``log_metric_by_epoch``: validation scalars at the
        epoch of an epoch-based loop, else at the iteration.
    is_main
        Rank 0; other ranks keep the buffer short and write nothing.
    logger, message_hub
        The run's MMEngine logger and message hub (at each log line the hub
        receives the values the line shows of the keys flexgraph logs).
    log_interval, max_iters, max_epochs, by_epoch, epoch_length
        For log cadence, ETA and the ``Epoch(train) [e/E][i/N]`` prefix.
    interactive
        Force the progress bar on or off; default: stdout is a terminal.
    device
        Where the logged values live (see the module docstring).
    progress
        The progress record this rank keeps for its launcher (the run context's
        ``launch.progress``): each log line writes the iterations done into it.
        ``None``: no launcher asked for one.
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
        #: per iteration since the last flush: the logged value (a loss, or a dict
        #: of them, as :attr:`keep` stores it) and the learning rate
        self.values: list[Any] = []
        self.lrs: list[float] = []
        #: the loop calls this with each iteration's logged value
        on_cpu = torch.device(device).type == "cpu"
        self.keep = _keeper(self.values, torch.Tensor.item if on_cpu else torch.Tensor.detach)
        self._window_n = 0  # iterations converted since the last log line
        self._last: dict[str, float] = {}
        self._jsonl: Any = None
        #: records flushed but not yet written: ready lines, or the arguments of
        #: _column_records (formatted when written)
        self._unwritten: list[Any] = []
        self._next_write = 0.0
        #: where the buffered values divide: (len(values) then, the epoch index of the
        #: values before it, the log line due there as (iters_done, batch_idx,
        #: perf_counter(), the hub's other train scalars' lengths) or None at the end
        #: of a pass)
        self._marks: list[tuple[int, int, tuple[int, int, float, Any] | None]] = []
        self._next_lines = 0.0  # the first line is printed at once
        #: compose every log line when due (set by the loop when hooks run every iteration)
        self.immediate = False
        self._handover: _ScalarHandOver | None = None
        self._bar: TerminalBar | None = None
        self._pending: list[str] = []  # lines for above the bar, printed at the next tick
        self._start_iter = 0
        self._next_iter = 1
        self._t0 = time.perf_counter()
        self._tick_every = 1
        self._t_tick = self._t0
        self._cpu_tick = time.process_time()
        self._redraw_cpu = 0.0  # what the last redraw cost, in CPU seconds
        self._progress_record = progress  # for a launcher; None when alone

    # -- lifecycle ------------------------------------------------------------------
    def open(self, start_iter: int, *, resumed: bool = False,
             repeats_evals: bool = False) -> None:
        """Start timing at ``start_iter`` and open the sinks (rank 0).

        A resumed run first cuts ``metrics.jsonl`` back to ``start_iter``: the
        records an interrupted run wrote after its checkpoint describe steps
        that were rolled back and are about to be trained (and logged) again.

        Parameters
        ----------
        start_iter : int
            The iterations already done.
        resumed : bool, default False
            The run resumed from a checkpoint.
        repeats_evals : bool, default False
            The run repeats the validation at ``start_iter`` too (the checkpoint was
            saved before its epoch's end), so its record goes.
        """
        self._start_iter = start_iter
        self._next_iter = start_iter + 1
        self._t0 = self._t_tick = time.perf_counter()
        self._cpu_tick = time.process_time()
        if not self.is_main:
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if resumed:
            _truncate_after(self.work_dir / METRICS_FILE, start_iter,
                            evals_at_last=not repeats_evals)
        # Open for the whole run (closed in close()): each write_records is one write.
        self._jsonl = open(self.work_dir / METRICS_FILE, "ab")  # noqa: SIM115
        self.log_values.watch(self.message_hub)
        backends = _scalar_backends(self.visualizer, self.vis_dir, self.json_name)
        if backends:
            self._handover = _ScalarHandOver(backends, self.json_name)
        if self.interactive:
            self._bar = TerminalBar("train", self.max_iters)
            self._bar.start()

    def close(self) -> None:
        """Write what is pending, release the sinks and close the visualizer (call
        :meth:`flush` first); safe to call twice.

        The visualizer is closed here, after the run's last hook point (MMEngine's
        LoggerHook closes it in ``after_run``), on every rank, and after a
        failure too: what hooks drew reaches its files."""
        if self._marks:
            self.flush(self._marks[-1][1])
        if self._jsonl is not None:
            self.write_records()
            self._jsonl.close()
            self._jsonl = None
        if self._handover is not None:
            self._handover.close()
            self._handover = None
        if self.visualizer is not None:
            self.visualizer.close()
            self.visualizer = None
        if self._bar is not None:
            self._redraw(self._bar.shown[0] if self._bar.shown else self._start_iter)
            self._bar.stop()
            self._bar = None

    # -- per-interval work ----------------------------------------------------------------
    @property
    def last_values(self) -> dict[str, float]:
        """The most recent value of every logged key (and ``lr``)."""
        return dict(self._last)

    def flush(self, epoch: int) -> None:
        """Convert the buffered iterations into records and print the log lines due
        among them; ``epoch`` is the epoch index of those after the last mark.

        Records are numbered on from the last flushed one. The values between
        two log lines are converted with one ``stack().tolist()``, so a flush
        costs one device sync per line however many iterations it covers. The
        records reach the file with the next :meth:`write_records`, which this
        calls every ``_RECORDS_SECONDS``.
        """
        values, lrs = self.values.copy(), self.lrs.copy()
        self.values.clear()  # in place: the loop holds the bound ``append`` methods
        self.lrs.clear()
        marks, self._marks = self._marks, []
        first = self._next_iter
        self._next_iter += len(values)
        if not self.is_main:
            return
        start = 0
        for end, mark_epoch, line in marks:
            self._convert(values[start:end], lrs[start:end], first + start, mark_epoch)
            if line is not None:
                self._line(*line, epoch=mark_epoch)
            start = end
        self._convert(values[start:], lrs[start:], first + start, epoch)
        now = time.perf_counter()
        self._next_lines = now + _LINES_SECONDS
        if now >= self._next_write:
            self.write_records()

    def end_pass(self, epoch: int) -> None:
        """A pass over the data (epoch index ``epoch``) ended: the records so far carry it."""
        if self.is_main:
            self._marks.append((len(self.values), epoch, None))
        else:
            self.flush(epoch)  # other ranks keep their buffers short

    def _convert(self, values: list[Any], lrs: list[float], first: int, epoch: int) -> None:
        """Floats of one stretch of iterations: into the logged histories, and records
        to write."""
        if not values:
            return
        if not any(issubclass(kind, Mapping) for kind in set(map(type, values))):
            keys, columns = _LOSS_ONLY, [_to_floats(values)]
        else:
            keys = _same_keys(values)
            if keys is None:  # iterations logged different keys: rare, formatted now
                self._unwritten.append(self._mixed_records(values, lrs, first, epoch + 1))
                keys, columns = (), []
            else:
                numbers = _to_floats([value[key] for value in values for key in keys])
                columns = [numbers[j::len(keys)] for j in range(len(keys))]
        extend = self.log_values.extend
        for key, column in zip(keys, columns, strict=True):
            extend(key, column)
            self._last[key] = column[-1]
        if keys:
            self._unwritten.append((keys, first, epoch + 1, columns, lrs))
        extend("lr", lrs)
        self._last["lr"] = lrs[-1]
        self._window_n += len(values)

    def write_records(self) -> None:
        """Write every record flushed so far to ``metrics.jsonl`` (rank 0).

        The loop calls this before each checkpoint save, so the file always
        reaches at least the iteration a resume starts from.
        """
        self._next_write = time.perf_counter() + _RECORDS_SECONDS
        if self._jsonl is None or not self._unwritten:
            return
        chunks, self._unwritten = self._unwritten, []
        lines: list[bytes] = []
        for chunk in chunks:
            lines.extend(chunk if isinstance(chunk, list) else _column_records(*chunk))
        self._jsonl.write(b"".join(lines))
        self._jsonl.flush()

    def _mixed_records(self, values: list[Any], lrs: list[float], first: int,
                       epoch: int) -> list[bytes]:
        """Records of iterations that logged different keys (or a loss, or a dict)."""
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
        logged: dict[str, list[float]] = {}
        for i, (keys, lr) in enumerate(zip(layout, lrs, strict=True)):
            items = [(key, next(numbers)) for key in keys]
            for key, number in items:
                logged.setdefault(key, []).append(number)
            lines.append(_record_line(first + i, epoch, items, lr))
        for key, column in logged.items():
            self.log_values.extend(key, column)
            self._last[key] = column[-1]
        return lines

    def log(self, iters_done: int, epoch: int, batch_idx: int) -> None:
        """A log line is due after ``iters_done`` iterations (``batch_idx`` of ``epoch``).

        The line (the log processor's statistics, see
        :mod:`~flexgraph.training.output._log_values`) and its hub and backend
        scalars are composed from the values up to here, but together with the other
        lines due within ``_LINES_SECONDS`` (the first one at once): at a
        millisecond per iteration, a line every 50 iterations costs a fifth of
        a millisecond when done alone (the logging and the hub's code, cold in
        the CPU's caches after the training step) and a fraction of that in a
        group. With :attr:`immediate` set (hooks run every iteration and may
        read the hub), every line is done at once. The loop flushes before
        any other hook point a hook may read the hub at, so it is current for hooks.

        Every rank passes here, so it is also where a launched rank records how
        far it got (see :mod:`flexgraph.training.output._progress`): once per log line,
        never per iteration.
        """
        if self._progress_record is not None:
            self._progress_record.iteration(iters_done, self.log_interval)
        now = time.perf_counter()
        hub_lengths = self.log_values.hub_lengths(self.message_hub) if self.is_main else None
        self._marks.append((len(self.values), epoch, (iters_done, batch_idx, now, hub_lengths)))
        if self.immediate or now >= self._next_lines or not self.is_main:
            self.flush(epoch)

    def _line(self, iters_done: int, batch_idx: int, at: float, hub_lengths: dict[str, int],
              *, epoch: int) -> None:
        """The log line due after ``iters_done`` iterations, at ``at`` (perf_counter);
        ``hub_lengths``: how far the hub's other ``train/`` scalars had come then."""
        if not self._window_n:
            return
        self._window_n = 0
        values = self.log_values.train(
            self.message_hub, hub_lengths,
            epoch_window=batch_idx if self.by_epoch else iters_done, global_window=iters_done)
        for key in self.log_values.own(values):  # what the line says of flexgraph's keys
            self.message_hub.update_scalar(f"train/{key}", values[key])
        shown_epoch = epoch + 1 if self.by_epoch else 1  # MMEngine's runner.epoch + 1
        if self._handover is not None:
            tags = self.log_values.scalars(values, "train")
            if self.log_by_epoch:
                tags["epoch"] = shown_epoch
            tags["iter"] = iters_done
            self._handover.scalars(tags, iters_done, time.time() - (time.perf_counter() - at))
        done = iters_done - self._start_iter
        per_iter = (at - self._t0) / done if done else float("nan")
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
        """Update the progress bar; return the iteration count of the next tick.

        The stride adapts so that ticks come about every ``_TICK_SECONDS``, or
        less often where the last redraw would otherwise cost more than
        ``_BAR_CPU_SHARE`` of the CPU time the iterations between two ticks
        take; each tick redraws the bar once: a fast loop pays one update and
        one redraw per tick, not per step.
        """
        if self._bar is None:
            return _NEVER
        since = max(self._tick_every, 1)
        per_iter = (time.perf_counter() - self._t_tick) / since
        cpu_per_iter = (time.process_time() - self._cpu_tick) / since
        stride = _TICK_SECONDS / per_iter if per_iter > 0 else 1.0
        if cpu_per_iter > 0:
            stride = max(stride, self._redraw_cpu / _BAR_CPU_SHARE / cpu_per_iter)
        self._tick_every = max(1, min(int(stride), 10_000))
        if self._marks:  # the lines due so far, and their loss for the status
            self.flush(self._marks[-1][1])
        cpu = time.process_time()
        self._redraw(iters_done)
        self._t_tick, self._cpu_tick = time.perf_counter(), time.process_time()
        self._redraw_cpu = self._cpu_tick - cpu
        return iters_done + self._tick_every

    def _redraw(self, iters_done: int) -> None:
        """The bar at ``iters_done``, with the lines pending above it (one write)."""
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
        """Record one evaluation: a ``"mode": mode`` line, hub, backends (``val``), log line.

        ``metrics.jsonl`` gets the metrics as the evaluator computed them. The
        hub gets each scalar under ``mode/``, as MMEngine's RuntimeInfoHook
        puts it; the line and the backends then get the log processor's
        statistics of the hub's ``mode/`` scalars, as MMEngine's LoggerHook
        logs them (a metric whose name matches ``mean_pattern``, a validation
        loss, is a mean over the last validations; ``custom_cfg``'s
        ``'epoch'`` windows cover every evaluation so far). As MMEngine's
        LoggerHook, the backends get validation scalars (at the epoch in
        epoch-based loops unless ``log_metric_by_epoch=False``, else at the
        iteration: 0 outside training) and no test scalars."""
        if not self.is_main:
            return
        values = {k: _scalar(v) for k, v in metrics.items()}
        if self._jsonl is not None:
            record = {"mode": mode, "iter": iters_done, "epoch": epoch, **values}
            self._unwritten.append([_json_line(record)])
            self.write_records()
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.message_hub.update_scalar(f"{mode}/{key}", value)
        logged = self.log_values.evaluation(self.message_hub, mode, epoch_window=iters_done + 1,
                                            global_window=iters_done + 1)
        if logged and mode == "val" and self._handover is not None:
            self._handover.scalars(self.log_values.scalars(logged, mode),
                                   epoch if self.metric_by_epoch else iters_done)
        shown = {**values, **logged}
        digits = self.digits
        text = "  ".join(f"{k}: {v:.{digits}f}" if isinstance(v, float) else f"{k}: {v}"
                         for k, v in shown.items())
        self._print(f"Epoch({mode}) [{epoch}]  {text}" if self.log_by_epoch
                    else f"Iter({mode}) [{iters_done}]  {text}")

    def info(self, message: str) -> None:
        """A one-off line (resume notices, the final summary), rank 0 only."""
        if self.is_main:
            self._print(message)

    def _print(self, line: str) -> None:
        """A log line: to the logger, or above the progress bar with its next tick.

        Printing above a live bar redraws the bar (a fraction of a millisecond);
        the lines of one tick go out together, so a short log interval costs one
        redraw per tick, not one per line. The log level applies either way, and
        the log file gets every line when it is said.
        """
        if self._bar is None:
            self.logger.info(line)
        elif self.logger.isEnabledFor(logging.INFO):
            self.logger.info(line, extra=FILE_ONLY)  # the console gets it with the next tick
            self._pending.append(line)
