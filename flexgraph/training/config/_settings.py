"""The config sections the runtime acts on, read into a frozen :class:`RunSettings` before
anything is built: each default and MMEngine spelling is decided here, once."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from flexgraph.training.config._access import section
from flexgraph.training.config._checks import check_sections
from flexgraph.training.config._watch import WatchPolicy, watch_policy
from flexgraph.training.errors import CheckpointNotFoundError, ConfigError

_LOOP_TYPES = {"EpochBasedTrainLoop": True, "IterBasedTrainLoop": False}


@attrs.frozen
class TrainSchedule:
    """How long training runs and when it validates.

    ``max_iters`` is always known; an iteration loop is one epoch to hooks, as in MMEngine.

    Parameters
    ----------
    by_epoch, max_epochs, max_iters
    epoch_length : int
        Batches per pass over the train dataloader (0 without ``len()``).
    val_interval, val_begin : int
        Validate every ``val_interval`` from ``val_begin``, and last.

    Examples
    --------
    >>> schedule = TrainSchedule(by_epoch=True, max_epochs=5, max_iters=50,
    ...                          epoch_length=10, val_interval=2, val_begin=1)
    >>> [epoch for epoch in range(1, 6) if schedule.val_due_after_epoch(epoch)]
    [2, 4, 5]
    """

    by_epoch: bool
    max_epochs: int
    max_iters: int
    epoch_length: int
    val_interval: int
    val_begin: int

    def val_due_after_epoch(self, epochs_done: int) -> bool:
        return self.by_epoch and epochs_done >= self.val_begin and (
            epochs_done % self.val_interval == 0 or epochs_done == self.max_epochs
        )

    def val_due_after_iter(self, iters_done: int) -> bool:
        return (not self.by_epoch) and iters_done >= self.val_begin and (
            iters_done % self.val_interval == 0 or iters_done == self.max_iters
        )


@attrs.frozen
class TrainLength:
    """``train_cfg`` as the config gives it, before the train dataloader's length is known."""

    by_epoch: bool
    max_epochs: int
    max_iters: int | None
    val_interval: int
    val_begin: int

    def schedule(self, epoch_length: int | None) -> TrainSchedule:
        if self.by_epoch and not epoch_length:
            raise ConfigError(
                "train_cfg: an epoch-based loop needs a train_dataloader with len(); "
                "use an iteration-based loop (max_iters=...) for iterable datasets"
            )
        max_iters = self.max_epochs * epoch_length if self.by_epoch else self.max_iters
        return TrainSchedule(
            by_epoch=self.by_epoch,
            max_epochs=self.max_epochs,
            max_iters=int(max_iters),
            epoch_length=int(epoch_length or 0),
            val_interval=self.val_interval,
            val_begin=self.val_begin,
        )


def train_length(cfg: Any) -> TrainLength:
    """Parse ``cfg.train_cfg`` (flexgraph's ``by_epoch`` or MMEngine's loop ``type``)."""
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
        max_epochs, max_iters = tc.get("max_epochs"), None
        if not isinstance(max_epochs, int) or max_epochs < 1:
            raise ConfigError(
                f"train_cfg: an epoch-based loop needs max_epochs >= 1, got {max_epochs!r}"
            )
        default_interval = 1
    else:
        max_iters = tc.get("max_iters")
        if not isinstance(max_iters, int) or max_iters < 1:
            raise ConfigError(
                f"train_cfg: an iteration-based loop needs max_iters >= 1, got {max_iters!r}"
            )
        max_epochs = 1  # MMEngine's IterBasedTrainLoop: the whole run is one epoch
        default_interval = 1000
    return TrainLength(
        by_epoch=bool(by_epoch),
        max_epochs=int(max_epochs),
        max_iters=None if max_iters is None else int(max_iters),
        val_interval=int(tc.get("val_interval", default_interval)),
        val_begin=int(tc.get("val_begin", 1)),
    )


_RULES = ("greater", "less")
# MMEngine's CheckpointHook defaults for inferring a ``save_best`` rule.
_GREATER_KEYS = ("acc", "top", "AR@", "auc", "precision", "mAP", "mDice", "mIoU", "mAcc",
                 "aAcc")
_LESS_KEYS = ("loss",)


def _every_n(done: int, n: int, start: int) -> bool:
    """MMEngine's ``Hook.every_n_*``."""
    dividend = done - start
    return dividend >= 0 and n > 0 and dividend % n == 0


@attrs.frozen
class CheckpointPolicy:
    """When to save and what to keep: MMEngine's ``CheckpointHook`` arguments, rule for rule.

    Parameters
    ----------
    enabled, by_epoch, save_last, save_begin, greater_keys, less_keys
        As MMEngine's (``enabled=False`` never saves).
    interval : int
        Save every ``interval`` epochs (or iterations); ``<= 0`` never.
    keep_last : int
        ``max_keep_ckpts``; ``-1`` keeps all.
    save_best, rules : tuple
        Metrics that keep a ``best_*`` checkpoint, and their comparisons.
    published_keys : tuple of str, optional
        Entries of published checkpoints; ``None`` publishes nothing.
    async_save : bool
        Write portable checkpoints in the background.

    Examples
    --------
    >>> policy = CheckpointPolicy(interval=500, by_epoch=False, keep_last=3)
    >>> [n for n in (499, 500, 1000, 1200) if policy.due_after_iter(n, max_iters=1200)]
    [500, 1000, 1200]
    """

    enabled: bool = True
    interval: int = 1
    by_epoch: bool = True
    keep_last: int = -1
    save_last: bool = True
    save_begin: int = 0
    save_best: tuple[str, ...] = ()
    rules: tuple[str | None, ...] = ()
    greater_keys: tuple[str, ...] = _GREATER_KEYS
    less_keys: tuple[str, ...] = _LESS_KEYS
    published_keys: tuple[str, ...] | None = None
    async_save: bool = False

    def due_after_iter(self, iters_done: int, max_iters: int) -> bool:
        return self.enabled and not self.by_epoch and (
            _every_n(iters_done, self.interval, self.save_begin)
            or (self.save_last and iters_done == max_iters))

    def due_after_epoch(self, epochs_done: int, max_epochs: int) -> bool:
        return self.enabled and self.by_epoch and (
            _every_n(epochs_done, self.interval, self.save_begin)
            or (self.save_last and epochs_done == max_epochs))

    def rule_for(self, key: str, rule: str | None = None) -> str:
        """``rule``, or the one MMEngine infers for metric ``key`` from its name."""
        if rule is not None:
            return rule
        name = key.lower()
        greater = {k.lower() for k in self.greater_keys}
        less = {k.lower() for k in self.less_keys}
        if name in greater:
            return "greater"
        if name in less:
            return "less"
        if any(k in name for k in greater):
            return "greater"
        if any(k in name for k in less):
            return "less"
        raise ConfigError(
            f"default_hooks.checkpoint: cannot infer whether a greater or a smaller "
            f"{key!r} is better; set rule='greater' or rule='less' (or list the key in "
            f"greater_keys / less_keys)")


def _names(value: Any, what: str, *, unique: bool = True) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"default_hooks.checkpoint.{what} must be a str or a list of str, "
                          f"got {value!r}")
    if unique and len(set(names)) != len(names):
        raise ConfigError(f"default_hooks.checkpoint.{what} lists a name twice: {value!r}")
    return tuple(names)


def checkpoint_policy(cfg: Any) -> CheckpointPolicy:
    """Map ``default_hooks.checkpoint`` onto a :class:`CheckpointPolicy`."""
    hooks = section(cfg, "default_hooks", {})
    if "checkpoint" in hooks and hooks["checkpoint"] is None:
        return CheckpointPolicy(enabled=False)
    ck = dict(hooks.get("checkpoint") or {"interval": 1})
    save_best = _names(ck.get("save_best"), "save_best") or ()
    if "auto" in save_best and len(save_best) > 1:
        raise ConfigError("default_hooks.checkpoint.save_best: 'auto' must stand alone")
    rules = _names(ck.get("rule"), "rule", unique=False) or (None,)
    for rule in rules:
        if rule is not None and rule not in _RULES:
            raise ConfigError(f"default_hooks.checkpoint.rule must be 'greater', 'less' or "
                              f"None, got {rule!r}")
    if len(rules) == 1:
        rules = rules * max(len(save_best), 1)
    elif len(rules) != len(save_best):
        raise ConfigError(f"default_hooks.checkpoint: {len(rules)} rules for "
                          f"{len(save_best)} save_best metrics; give one rule or one each")
    save_begin = int(ck.get("save_begin", 0))
    if save_begin < 0:
        raise ConfigError(f"default_hooks.checkpoint.save_begin must be >= 0, got {save_begin}")
    policy = CheckpointPolicy(
        interval=int(ck.get("interval", -1)),
        by_epoch=bool(ck.get("by_epoch", True)),
        keep_last=int(ck.get("max_keep_ckpts", -1)),
        save_last=bool(ck.get("save_last", True)),
        save_begin=save_begin,
        save_best=save_best,
        greater_keys=_names(ck.get("greater_keys"), "greater_keys") or _GREATER_KEYS,
        less_keys=_names(ck.get("less_keys"), "less_keys") or _LESS_KEYS,
        published_keys=_names(ck.get("published_keys"), "published_keys"),
        async_save=bool(ck.get("async_save", False)),
    )
    # Decided now, as MMEngine does when it builds the hook; 'auto' waits for metrics.
    resolved = tuple(rule if key == "auto" else policy.rule_for(key, rule)
                     for key, rule in zip(save_best, rules, strict=False))
    return attrs.evolve(policy, rules=resolved)


#: MMEngine's ``LogProcessor.mean_pattern``: the keys logged as a mean over the window.
MEAN_PATTERN = r".*(loss|time|data_time|grad_norm).*"
_STATISTICS = frozenset({"mean", "max", "min", "current"})  # MMEngine's HistoryBuffer's


@attrs.frozen
class LogProcessorPolicy:
    """What a logged value is: MMEngine's ``log_processor`` options.

    Parameters
    ----------
    window_size, custom_cfg, num_digits, mean_pattern
        As MMEngine's.
    by_epoch : bool or None
        Log by epoch or iteration; ``None``: as the train loop runs.
    log_with_hierarchy : bool
        Scalars keep their ``train/`` and ``val/`` prefixes.
    """

    window_size: int = 10
    by_epoch: bool | None = None
    custom_cfg: tuple[Mapping[str, Any], ...] = ()
    num_digits: int = 4
    log_with_hierarchy: bool = False
    mean_pattern: str = MEAN_PATTERN


def log_processor_policy(cfg: Any) -> LogProcessorPolicy:
    """``log_processor``, checked as MMEngine's ``LogProcessor`` does."""
    given = section(cfg, "log_processor")
    if given is None:
        return LogProcessorPolicy()
    if not isinstance(given, Mapping):
        raise ConfigError(f"log_processor must be a dict of LogProcessor's options, got "
                          f"{type(given).__name__}")
    options = dict(given)
    kind = options.pop("type", "LogProcessor")
    if kind not in ("LogProcessor", "mmengine.LogProcessor") and not (
            isinstance(kind, type) and kind.__name__ == "LogProcessor"):
        raise ConfigError(f"log_processor: type={kind!r} is not supported; flexgraph applies "
                          f"MMEngine's LogProcessor options (window_size, by_epoch, "
                          f"custom_cfg, num_digits, log_with_hierarchy, mean_pattern)")
    fields = attrs.fields_dict(LogProcessorPolicy)
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(f"log_processor: LogProcessor has no option {unknown}; its options "
                          f"are {', '.join(fields)}")
    window = options.get("window_size", 10)
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConfigError(f"log_processor.window_size must be an int >= 1, got {window!r}")
    by_epoch = bool(options.get("by_epoch", True))
    custom = tuple(_custom_log(entry, i, by_epoch)
                   for i, entry in enumerate(options.get("custom_cfg") or ()))
    names = [entry.get("log_name", entry["data_src"]) for entry in custom]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"log_processor.custom_cfg names {twice} twice (a log_name, or a "
                          f"data_src without one); give each entry its own log_name")
    return LogProcessorPolicy(
        window_size=window, by_epoch=by_epoch, custom_cfg=custom,
        num_digits=int(options.get("num_digits", 4)),
        log_with_hierarchy=bool(options.get("log_with_hierarchy", False)),
        mean_pattern=str(options.get("mean_pattern", MEAN_PATTERN)))


def _custom_log(entry: Any, i: int, by_epoch: bool) -> dict[str, Any]:
    what = f"log_processor.custom_cfg[{i}]"
    if not isinstance(entry, Mapping) or not {"data_src", "method_name"} <= set(entry):
        raise ConfigError(f"{what} must be a dict with a data_src (the logged key) and a "
                          f"method_name, got {entry!r}")
    entry = dict(entry)
    method = entry["method_name"]
    if method not in _STATISTICS:
        raise ConfigError(f"{what}: method_name {method!r} is not one of "
                          f"{', '.join(sorted(_STATISTICS))}")
    window = entry.get("window_size")
    if method == "current" and window is not None:
        raise ConfigError(f"{what}: method_name 'current' takes no window_size")
    if not (window is None or window in ("epoch", "global")
            or (isinstance(window, int) and window >= 1)):
        raise ConfigError(f"{what}: window_size must be an int >= 1, 'epoch' or 'global', "
                          f"got {window!r}")
    if window == "epoch" and not by_epoch:
        raise ConfigError(f"{what}: window_size='epoch' needs log_processor.by_epoch=True")
    return entry


@attrs.frozen
class LoggerPolicy:
    """When a log line is written and what it says (``default_hooks.logger``)."""

    interval: int = 10
    ignore_last: bool = True
    metric_by_epoch: bool = True
    processor: LogProcessorPolicy = LogProcessorPolicy()


def logger_policy(cfg: Any) -> LoggerPolicy:
    processor = log_processor_policy(cfg)
    logger = section(section(cfg, "default_hooks", {}), "logger", {})
    if not isinstance(logger, Mapping):
        return LoggerPolicy(processor=processor)
    interval = logger.get("interval", 10)
    if not isinstance(interval, int) or interval < 1:
        raise ConfigError(f"default_hooks.logger.interval must be an int >= 1, got {interval!r}")
    flags = {}
    for name in ("ignore_last", "log_metric_by_epoch"):
        flags[name] = logger.get(name, True)
        if not isinstance(flags[name], bool):
            raise ConfigError(f"default_hooks.logger.{name} must be True or False, "
                              f"got {flags[name]!r}")
    return LoggerPolicy(interval=interval, ignore_last=flags["ignore_last"],
                        metric_by_epoch=flags["log_metric_by_epoch"], processor=processor)


def work_dir_of(cfg: Any) -> str:
    """``cfg.work_dir``; else ``work_dirs/<config file stem>`` as MMEngine's tools do."""
    work_dir = section(cfg, "work_dir")
    if work_dir:
        return str(work_dir)
    filename = getattr(cfg, "filename", None)
    stem = os.path.splitext(os.path.basename(filename))[0] if filename else "flexgraph"
    return os.path.join("work_dirs", stem)


def restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def resume_source(cfg: Any) -> str | None:
    """What ``resume`` asks for: ``None``, ``'auto'``, or a path.

    ``resume=True`` follows MMEngine: ``load_from`` when set, else the latest.

    Parameters
    ----------
    cfg : Config or Mapping

    Returns
    -------
    str or None
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

    Parameters
    ----------
    signals : tuple of str, default ('SIGTERM', 'SIGINT')
    check_interval : int, default 10
        Iterations between the ranks' agreements.
    """

    signals: tuple[str, ...] = ("SIGTERM", "SIGINT")
    check_interval: int = 10


_UNCATCHABLE = ("SIGKILL", "SIGSTOP", "SIGCHLD")


def _signal_name(value: Any) -> str:
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
    """Map ``cfg.preemption`` onto a :class:`StopPolicy`."""
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


def experiment_name_of(cfg: Any) -> str:
    name = section(cfg, "experiment_name")
    filename = getattr(cfg, "filename", None)
    if not name and filename:
        name = os.path.splitext(os.path.basename(filename))[0]
    return str(name or "")


@attrs.frozen
class RunSettings:
    """The run's settings, read once before any step runs; components stay in ``cfg``.

    Parameters
    ----------
    work_dir, experiment_name, log_level, load_from, resume, checkpoint, logger, stop, watch
    restart : int
        The process group's restarts so far.
    train : TrainLength or None
        ``None`` without ``train_cfg``.

    Examples
    --------
    >>> settings = read_settings({"work_dir": "w", "train_cfg": {"max_iters": 8}})
    >>> settings.work_dir, settings.train.max_iters, settings.logger.interval
    ('w', 8, 10)
    """

    work_dir: str
    experiment_name: str
    log_level: str
    load_from: str | None
    resume: str | None
    restart: int
    train: TrainLength | None
    checkpoint: CheckpointPolicy
    logger: LoggerPolicy
    stop: StopPolicy
    watch: WatchPolicy = WatchPolicy()

    def train_schedule(self, epoch_length: int | None) -> TrainSchedule:
        if self.train is None:
            raise ConfigError("train_cfg: training needs max_epochs >= 1 or max_iters >= 1; "
                              "add train_cfg=dict(by_epoch=True, max_epochs=...)")
        return self.train.schedule(epoch_length)

    def weights_to_load(self) -> str | None:
        """``load_from``, unless ``resume`` will load that very file (then ``None``)."""
        return None if self.load_from == self.resume else self.load_from


def read_settings(cfg: Any) -> RunSettings:
    """Check the component sections and read the rest into one :class:`RunSettings`.

    Parameters
    ----------
    cfg : Config or Mapping
        After ``--cfg-options`` and the command line's flags.

    Returns
    -------
    RunSettings
    """
    check_sections(cfg)
    load_from = section(cfg, "load_from")
    return RunSettings(
        work_dir=work_dir_of(cfg),
        experiment_name=experiment_name_of(cfg),
        log_level=str(section(cfg, "log_level", "INFO")),
        load_from=str(load_from) if load_from else None,
        resume=resume_source(cfg),
        restart=restart_count(),
        train=train_length(cfg) if section(cfg, "train_cfg") is not None else None,
        checkpoint=checkpoint_policy(cfg),
        logger=logger_policy(cfg),
        stop=stop_policy(cfg),
        watch=watch_policy(cfg),
    )


def _is_local(path: str) -> bool:
    return "://" not in path


def check_paths(settings: RunSettings) -> None:
    """Refuse, before any step runs, paths the run could not use.

    Parameters
    ----------
    settings : RunSettings

    Raises
    ------
    ConfigError
        ``work_dir`` is, or lies under, a file.
    CheckpointNotFoundError
        ``load_from`` or ``resume`` names a missing local path.
    """
    work_dir = Path(settings.work_dir).absolute()
    for folder in (work_dir, *work_dir.parents):
        if folder.exists() and not folder.is_dir():
            under = "" if folder == work_dir else f" (under the file {str(folder)!r})"
            raise ConfigError(f"work_dir {settings.work_dir!r} is not a directory{under}; "
                              f"give --work-dir (or work_dir=) a folder, or a path that does "
                              f"not exist yet")
    for key, path in (("load_from", settings.load_from), ("resume", settings.resume)):
        if path and path != "auto" and _is_local(path) and not os.path.exists(path):
            raise CheckpointNotFoundError(
                f"{key} {path!r} does not exist; give an existing checkpoint file or folder"
                + (", or --resume auto for the latest in work_dir" if key == "resume" else ""))
