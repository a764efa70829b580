"""Read the MMEngine-style config sections the training runtime acts on.

The loop, the checkpointer and the output never look into ``cfg`` themselves:
they receive the small frozen values below. That keeps every default and every
MMEngine spelling (``train_cfg=dict(type='IterBasedTrainLoop', ...)``,
``default_hooks.checkpoint``, ``default_hooks.logger``) in one place, and turns a
contradictory config into a :class:`ConfigError` before anything is built.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Mapping
from typing import Any

import attrs

from flexgraph.training.errors import ConfigError

__all__ = [
    "CheckpointPolicy",
    "StopPolicy",
    "TrainSchedule",
    "checkpoint_policy",
    "log_interval",
    "restart_count",
    "resume_source",
    "section",
    "stop_policy",
    "train_schedule",
    "work_dir_of",
]

_LOOP_TYPES = {"EpochBasedTrainLoop": True, "IterBasedTrainLoop": False}


def section(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a Config, ConfigDict or plain dict, ``default`` if absent."""
    if cfg is None:
        return default
    value = cfg.get(key, default)
    return default if value is None else value


@attrs.frozen
class TrainSchedule:
    """How long training runs and when it validates.

    ``by_epoch`` loops run ``max_epochs`` passes over the train dataloader;
    iteration loops run ``max_iters`` iterations, re-iterating the dataloader as
    often as needed. ``max_iters`` is always known (``max_epochs * epoch_length``
    in epoch mode) so that progress, ETA and gradient accumulation work the same
    in both modes.
    """

    by_epoch: bool
    max_epochs: int
    max_iters: int
    epoch_length: int
    val_interval: int
    val_begin: int

    def val_due_after_epoch(self, epochs_done: int) -> bool:
        """MMEngine's rule: every ``val_interval`` epochs from ``val_begin``, and last."""
        return self.by_epoch and epochs_done >= self.val_begin and (
            epochs_done % self.val_interval == 0 or epochs_done == self.max_epochs
        )

    def val_due_after_iter(self, iters_done: int) -> bool:
        """Same rule counted in iterations, for iteration-based loops."""
        return (not self.by_epoch) and iters_done >= self.val_begin and (
            iters_done % self.val_interval == 0 or iters_done == self.max_iters
        )


def train_schedule(cfg: Any, epoch_length: int | None) -> TrainSchedule:
    """Parse ``cfg.train_cfg`` (flexgraph's ``by_epoch`` or MMEngine's loop ``type``).

    Raises
    ------
    ConfigError
        No length given, both lengths given, an unknown loop type, or an epoch
        loop over a dataloader without ``len()``.
    """
    tc = dict(section(cfg, "train_cfg", {}))
    loop_type = tc.pop("type", None)
    if loop_type is not None and loop_type not in _LOOP_TYPES:
        raise ConfigError(
            f"train_cfg.type={loop_type!r} is not supported; use 'EpochBasedTrainLoop' "
            f"or 'IterBasedTrainLoop' (or by_epoch=True/False)"
        )
    by_epoch = tc.pop("by_epoch", None)
    if by_epoch is None:
        by_epoch = _LOOP_TYPES[loop_type] if loop_type else "max_iters" not in tc
    if by_epoch:
        max_epochs = tc.get("max_epochs")
        if not isinstance(max_epochs, int) or max_epochs < 1:
            raise ConfigError(
                f"train_cfg: an epoch-based loop needs max_epochs >= 1, got {max_epochs!r}"
            )
        if not epoch_length:
            raise ConfigError(
                "train_cfg: an epoch-based loop needs a train_dataloader with len(); "
                "use an iteration-based loop (max_iters=...) for iterable datasets"
            )
        max_iters = max_epochs * epoch_length
        default_interval = 1
    else:
        max_iters = tc.get("max_iters")
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ConfigError(
                f"train_cfg: an iteration-based loop needs max_iters >= 1, got {max_iters!r}"
            )
        max_epochs = math.ceil(max_iters / epoch_length) if epoch_length else 1
        default_interval = 1000
    val_interval = int(tc.get("val_interval", default_interval))
    if val_interval < 1:
        raise ConfigError(f"train_cfg.val_interval must be >= 1, got {val_interval}")
    return TrainSchedule(
        by_epoch=bool(by_epoch),
        max_epochs=int(max_epochs),
        max_iters=int(max_iters),
        epoch_length=int(epoch_length or 0),
        val_interval=val_interval,
        val_begin=int(tc.get("val_begin", 1)),
    )


@attrs.frozen
class CheckpointPolicy:
    """When to save (MMEngine's ``CheckpointHook`` arguments, minus storage options).

    ``interval <= 0`` saves only at the end (when ``save_last``); ``enabled=False``
    (``default_hooks.checkpoint=None``) never saves. In an iteration-based loop an
    epoch interval has no epoch ends to fire on, so it saves only at the end, as
    MMEngine does.
    """

    enabled: bool = True
    interval: int = 1
    by_epoch: bool = True
    keep_last: int = -1
    save_last: bool = True


def checkpoint_policy(cfg: Any) -> CheckpointPolicy:
    """Map ``default_hooks.checkpoint`` onto a :class:`CheckpointPolicy`."""
    hooks = section(cfg, "default_hooks", {})
    if "checkpoint" in hooks and hooks["checkpoint"] is None:
        return CheckpointPolicy(enabled=False)
    ck = dict(hooks.get("checkpoint") or {"interval": 1})
    return CheckpointPolicy(
        interval=int(ck.get("interval", -1)),
        by_epoch=bool(ck.get("by_epoch", True)),
        keep_last=int(ck.get("max_keep_ckpts", -1)),
        save_last=bool(ck.get("save_last", True)),
    )


def log_interval(cfg: Any) -> int:
    """``default_hooks.logger.interval`` (MMEngine's default: 10 iterations)."""
    logger = section(section(cfg, "default_hooks", {}), "logger", {})
    interval = int(logger.get("interval", 10)) if isinstance(logger, Mapping) else 10
    if interval < 1:
        raise ConfigError(f"default_hooks.logger.interval must be >= 1, got {interval}")
    return interval


def work_dir_of(cfg: Any) -> str:
    """``cfg.work_dir``; else ``work_dirs/<config file stem>`` as MMEngine's tools do."""
    work_dir = section(cfg, "work_dir")
    if work_dir:
        return str(work_dir)
    filename = getattr(cfg, "filename", None)
    stem = os.path.splitext(os.path.basename(filename))[0] if filename else "flexgraph"
    return os.path.join("work_dirs", stem)


def restart_count() -> int:
    """How often torch's elastic agent has restarted this process's group (0: never).

    ``flexgraph run --max-restarts K`` (or ``torchrun --max-restarts``) restarts
    every rank after one dies; a restarted rank resumes on its own (see
    :func:`flexgraph.training.resume.resume_training`).
    """
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def resume_source(cfg: Any) -> str | None:
    """What ``resume`` asks for: ``None`` (no resume), ``'auto'``, or a path.

    ``resume=True`` follows MMEngine: resume from ``load_from`` when it is set,
    otherwise from the latest checkpoint in ``work_dir``. ``resume='auto'``
    always searches ``work_dir`` (``load_from`` then only seeds a fresh start).
    """
    resume = section(cfg, "resume", False)
    if resume is False or resume is None:
        return None
    if resume is True:
        return section(cfg, "load_from") or "auto"
    if isinstance(resume, (str, os.PathLike)):
        return os.fspath(resume)
    raise ConfigError(f"resume must be False, True, 'auto' or a path, got {resume!r}")


@attrs.frozen
class StopPolicy:
    """Which signals stop a run cleanly, and how often the ranks agree on a stop.

    On one of ``signals`` the loop finishes the iteration under way, saves a
    checkpoint and ends the run (see :mod:`flexgraph.training.preemption`). A
    single process stops right after that iteration; several ranks compare notes
    every ``check_interval`` iterations (one all-reduce of one number), so they
    stop at the same iteration, at most ``check_interval`` iterations after the
    signal. ``signals=()`` (``preemption=None``) leaves every signal's default
    action alone.
    """

    signals: tuple[str, ...] = ("SIGTERM", "SIGINT")
    check_interval: int = 10


_UNCATCHABLE = ("SIGKILL", "SIGSTOP", "SIGCHLD")


def _signal_name(value: Any) -> str:
    """``'USR1'``, ``'SIGUSR1'`` or ``10`` -> ``'SIGUSR1'``; refuses what cannot stop a run."""
    try:
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            name = signal.Signals(int(value)).name
        else:
            name = str(value).upper()
            name = name if name.startswith("SIG") else "SIG" + name
            signal.Signals[name]  # noqa: B018 (raises KeyError for an unknown name)
    except (KeyError, ValueError):
        raise ConfigError(f"preemption.signal={value!r} is not a signal on this system; "
                          f"use a name such as 'SIGUSR1' (SLURM's --signal=USR1@90)") from None
    if name in _UNCATCHABLE:
        raise ConfigError(f"preemption.signal={value!r} cannot stop a run cleanly "
                          f"({', '.join(_UNCATCHABLE)} cannot be caught or are in use); "
                          f"use e.g. 'SIGUSR1'")
    return name


def stop_policy(cfg: Any) -> StopPolicy:
    """Map ``cfg.preemption`` onto a :class:`StopPolicy`.

    ``preemption=dict(signal='SIGUSR1', check_interval=10)``: ``signal`` (a name,
    a number or a list of them) is handled besides SIGTERM and SIGINT;
    ``preemption=None`` handles no signal at all.
    """
    if cfg is not None and "preemption" in cfg and cfg["preemption"] is None:
        return StopPolicy(signals=())
    options = dict(section(cfg, "preemption", {}))
    unknown = sorted(set(options) - {"signal", "check_interval"})
    if unknown:
        raise ConfigError(f"preemption.{unknown[0]} is not an option; preemption takes "
                          f"signal and check_interval")
    extra = options.get("signal") or ()
    extra = [extra] if isinstance(extra, (str, int)) else list(extra)
    signals = tuple(dict.fromkeys(["SIGTERM", "SIGINT", *map(_signal_name, extra)]))
    interval = options.get("check_interval", 10)
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ConfigError(f"preemption.check_interval must be an integer >= 1, got "
                          f"{interval!r}")
    return StopPolicy(signals=signals, check_interval=interval)
