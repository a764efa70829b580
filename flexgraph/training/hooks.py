"""MMEngine hooks without MMEngine's Runner: the ``runner`` view and the dispatcher.

A user's ``mmengine.hooks.Hook`` subclass must run unchanged, so hooks receive a
:class:`RunnerView` that has the attributes such hooks read (``model``,
``optim_wrapper``, ``epoch``, ``iter``, ``max_iters``, ``work_dir``, ``logger``,
``message_hub``, ...), with MMEngine's meaning: during ``*_train_iter`` hooks
``runner.iter`` is the index of the current iteration (completed iterations
before it), during ``*_train_epoch`` hooks ``runner.epoch`` is the index of the
current epoch, so ``Hook.every_n_train_iters`` / ``every_n_epochs`` /
``is_last_train_iter`` work as written.

:class:`Hooks` precomputes, for every hook point, a tuple of the bound methods
of only those hooks that override it. A point nobody overrides is an empty
tuple, so the per-iteration cost of hooks in the common case is iterating over
``()``. Hooks are ordered by priority, stably, like MMEngine's
``Runner.register_hook``.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterable
from typing import Any

import torch
from mmengine.logging import MessageHub, MMLogger
from mmengine.registry import HOOKS

from flexgraph.training.build import build_from_cfg
from flexgraph.training.config import section, work_dir_of
from flexgraph.training.errors import ConfigError
from flexgraph.training.workdir import active_record, console_logger

__all__ = ["HOOK_POINTS", "PRIORITIES", "Hooks", "RunnerView", "build_hooks"]

HOOK_POINTS = (
    "before_run", "after_run",
    "before_train", "after_train",
    "before_train_epoch", "after_train_epoch",
    "before_train_iter", "after_train_iter",
    "before_val", "after_val",
    "before_val_epoch", "after_val_epoch",
    "before_val_iter", "after_val_iter",
    "before_test", "after_test",
    "before_test_epoch", "after_test_epoch",
    "before_test_iter", "after_test_iter",
    "before_save_checkpoint", "after_load_checkpoint",
)

# Hook's epoch/iter methods delegate to these generic ones; overriding the
# generic one counts as overriding every point that delegates to it.
_DELEGATES = {
    "_before_epoch": ("before_train_epoch", "before_val_epoch", "before_test_epoch"),
    "_after_epoch": ("after_train_epoch", "after_val_epoch", "after_test_epoch"),
    "_before_iter": ("before_train_iter", "before_val_iter", "before_test_iter"),
    "_after_iter": ("after_train_iter", "after_val_iter", "after_test_iter"),
}

_RUN_NUMBERS = itertools.count()  # logger / message-hub names are process-global

# MMEngine default hooks whose behaviour is built into the loop. ``checkpoint``
# and ``logger`` are read by :mod:`flexgraph.training.config`.
_BUILTIN_HOOK_KEYS = frozenset({
    "runtime_info", "timer", "sampler_seed", "logger", "param_scheduler", "checkpoint",
})
_BUILTIN_HOOK_TYPES = frozenset({
    "RuntimeInfoHook", "IterTimerHook", "DistSamplerSeedHook", "LoggerHook",
    "ParamSchedulerHook", "CheckpointHook", "SyncBuffersHook",
})


class RunnerView:
    """What a hook sees as ``runner``: the run's artifacts and its counters.

    Steps fill in artifacts as the graph builds them (``model`` during
    ``load_checkpoint``, the rest when ``train`` starts); the loop updates
    ``epoch`` and ``iter`` as plain attribute stores, so reading them costs a hook
    nothing and keeping them current costs the loop next to nothing.
    """

    def __init__(self, cfg: Any, *, work_dir: str, timestamp: str,
                 logger: MMLogger, message_hub: MessageHub) -> None:
        self.cfg = cfg
        self.work_dir = work_dir
        self.log_dir = work_dir
        self.timestamp = timestamp
        self.experiment_name = f"flexgraph_{timestamp}"
        self.logger = logger
        self.message_hub = message_hub
        self.model: torch.nn.Module | None = None
        self.optim_wrapper: Any = None
        self.param_schedulers: list[Any] = []
        self.train_dataloader: Any = None
        self.val_dataloader: Any = None
        self.test_dataloader: Any = None
        self.val_evaluator: Any = None
        self.test_evaluator: Any = None
        self.visualizer: Any = None
        self.seed: int | None = None
        self.epoch = 0
        self.iter = 0
        self.max_epochs = 0
        self.max_iters = 0
        self.val_interval = 1
        self.val_begin = 1

    @property
    def rank(self) -> int:
        """Global rank (0 without a process group)."""
        dist = torch.distributed
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        """Number of processes (1 without a process group)."""
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def train_loop(self) -> RunnerView:
        """MMEngine hooks read ``runner.train_loop.max_iters`` etc.; we are that too."""
        return self

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """MMEngine's ``Runner.call_hook``, for hooks that call other hooks."""
        self.hooks.call(fn_name, **kwargs)

    hooks: Hooks


def _overrides(hook: Any, point: str) -> bool:
    # Only an imported class can have instances: when nothing imported mmengine.hooks
    # (a run whose hooks are all plain objects), there is no need to import it here.
    module = sys.modules.get("mmengine.hooks.hook")
    Hook = getattr(module, "Hook", None)  # noqa: N806 (the class, as MMEngine names it)
    if Hook is None or not isinstance(hook, Hook):
        return callable(getattr(hook, point, None))
    if point in vars(hook):
        return True
    cls = type(hook)
    if getattr(cls, point) is not getattr(Hook, point):
        return True
    return any(point in points and getattr(cls, generic) is not getattr(Hook, generic)
               for generic, points in _DELEGATES.items())


class Hooks:
    """The run's hooks in priority order, dispatched per hook point.

    Every name in :data:`HOOK_POINTS` is an attribute holding a tuple of bound
    methods; the loop iterates it directly on hot paths
    (``for fn in hooks.after_train_iter: fn(runner, batch_idx=..., ...)``) and
    uses :meth:`call` elsewhere.
    """

    def __init__(self, hooks: Iterable[Any], runner: RunnerView) -> None:
        ordered = sorted(enumerate(hooks), key=lambda ih: (_priority(ih[1]), ih[0]))
        self.hooks: tuple[Any, ...] = tuple(h for _, h in ordered)
        self.runner = runner
        runner.hooks = self
        self._run_started = False
        for point in HOOK_POINTS:
            setattr(self, point, tuple(getattr(h, point) for h in self.hooks
                                       if _overrides(h, point)))

    def call(self, point: str, **kwargs: Any) -> None:
        """Fire one hook point with MMEngine's keyword arguments."""
        runner = self.runner
        for fn in getattr(self, point):
            fn(runner, **kwargs)

    def start_run(self) -> None:
        """Fire ``before_run`` once per run, before any other hook point.

        Loading a checkpoint happens in graph steps that precede the loop, and
        hooks such as EMA set up state in ``before_run`` that their
        ``after_load_checkpoint`` needs; so whichever step fires first starts the
        run, as MMEngine's Runner fires ``before_run`` before loading.
        """
        if not self._run_started:
            self._run_started = True
            self.call("before_run")

    def end_run(self) -> None:
        """Fire ``after_run``; the next :meth:`start_run` begins a new run."""
        self.call("after_run")
        self._run_started = False

    def __len__(self) -> int:
        return len(self.hooks)

    def __repr__(self) -> str:
        return f"Hooks({[type(h).__name__ for h in self.hooks]})"


# mmengine.runner.Priority's levels. Not imported from there: ``import mmengine.runner``
# imports every runner and strategy, DeepSpeed included when it is installed
# (seconds, and an accelerator warning on every run); a test checks the values.
PRIORITIES = {"HIGHEST": 0, "VERY_HIGH": 10, "HIGH": 30, "ABOVE_NORMAL": 40, "NORMAL": 50,
              "BELOW_NORMAL": 60, "LOW": 70, "VERY_LOW": 90, "LOWEST": 100}


def _priority(hook: Any) -> int:
    """``mmengine.runner.get_priority`` of the hook's ``priority`` (name, enum or 0..100)."""
    priority = getattr(hook, "priority", "NORMAL")
    priority = getattr(priority, "name", priority)  # a Priority enum member
    if isinstance(priority, str) and priority.upper() in PRIORITIES:
        return PRIORITIES[priority.upper()]
    if isinstance(priority, int) and not isinstance(priority, bool) and 0 <= priority <= 100:
        return priority
    raise ConfigError(f"{type(hook).__name__}: priority={priority!r} is neither an int in "
                      f"0..100 nor one of {', '.join(PRIORITIES)}")


def _hook_from_cfg(cfg: Any, what: str) -> Any:
    if not isinstance(cfg, dict) and not hasattr(cfg, "items"):
        return cfg  # an already-built hook object
    args = dict(cfg)
    priority = args.pop("priority", None)
    hook = build_from_cfg(args, HOOKS, what=what)
    if priority is not None:
        hook.priority = priority
    return hook


def _is_builtin(key: str, cfg: Any) -> bool:
    """A default hook the loop implements (``checkpoint=dict(interval=1)`` counts too)."""
    type_ = cfg.get("type") if hasattr(cfg, "get") else type(cfg)
    if type_ is None:
        return key in _BUILTIN_HOOK_KEYS
    name = type_ if isinstance(type_, str) else getattr(type_, "__name__", "")
    return name.rpartition(".")[2] in _BUILTIN_HOOK_TYPES


def build_hooks(cfg: Any) -> Hooks:
    """Build ``custom_hooks`` and any non-builtin ``default_hooks`` entries.

    MMEngine's built-in default hooks (timer, logger, param scheduler,
    checkpoint, sampler seed, runtime info) are accepted and skipped: the loop
    does their work itself, reading ``default_hooks.checkpoint`` and
    ``default_hooks.logger`` for their settings. Any other entry is a hook the
    user asked for and is built like a custom hook.
    """
    hooks = []
    defaults = section(cfg, "default_hooks", {})
    for key, hook_cfg in defaults.items():
        if hook_cfg is None or _is_builtin(key, hook_cfg):
            continue
        hooks.append(_hook_from_cfg(hook_cfg, f"default_hooks.{key}"))
    custom = section(cfg, "custom_hooks", [])
    if not isinstance(custom, (list, tuple)):
        raise ConfigError(f"custom_hooks must be a list of hook dicts, got {type(custom)}")
    hooks.extend(_hook_from_cfg(c, f"custom_hooks[{i}]") for i, c in enumerate(custom))
    record = active_record()  # `flexgraph run` opened one: its logger writes the log file
    timestamp = record.timestamp if record else time.strftime("%Y%m%d_%H%M%S", time.localtime())
    logger = record.logger if record else console_logger(timestamp, section(cfg, "log_level",
                                                                            "INFO"))
    runner = RunnerView(
        cfg,
        work_dir=work_dir_of(cfg),
        timestamp=timestamp,
        logger=logger,
        message_hub=MessageHub.get_instance(f"flexgraph_{timestamp}_{next(_RUN_NUMBERS)}"),
    )
    if record:
        runner.log_dir = str(record.run_dir)
    return Hooks(hooks, runner)
