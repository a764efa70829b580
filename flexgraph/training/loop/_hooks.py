"""MMEngine hooks without MMEngine's Runner: the ``runner`` view and the dispatcher.

A user's ``mmengine.hooks.Hook`` subclass runs unchanged: it receives a
:class:`RunnerView` with the attributes such hooks read, in MMEngine's meaning.
Of MMEngine's default hooks, ``param_scheduler`` and ``checkpoint`` are hooks
here too; the others are built into the loop.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from mmengine.hooks import Hook
from mmengine.logging import MessageHub, MMLogger
from mmengine.registry import HOOKS

from flexgraph.training.config import (
    RunSettings,
    TrainSchedule,
    build_from_cfg,
    resolve_type,
    resume_source,
    section,
    type_name,
    warn_unused_keys,
)
from flexgraph.training.errors import ConfigError
from flexgraph.training.loop._checkpoint_hook import BuiltinCheckpointHook
from flexgraph.training.loop._sync_norm import SyncNormHook, replaces
from flexgraph.training.output import RunContext
from flexgraph.training.runtime import launch_rank, this_rank, world_size

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

# Overriding one of Hook's generic methods overrides every point that delegates to it.
_DELEGATES = {
    "_before_epoch": ("before_train_epoch", "before_val_epoch", "before_test_epoch"),
    "_after_epoch": ("after_train_epoch", "after_val_epoch", "after_test_epoch"),
    "_before_iter": ("before_train_iter", "before_val_iter", "before_test_iter"),
    "_after_iter": ("after_train_iter", "after_val_iter", "after_test_iter"),
}

_RUN_NUMBERS = itertools.count()  # visualizer names are process-global

# MMEngine's default hooks, in the order its Runner registers them (which breaks ties).
_DEFAULT_HOOKS = {
    "runtime_info": {"type": "RuntimeInfoHook"},
    "timer": {"type": "IterTimerHook"},
    "sampler_seed": {"type": "DistSamplerSeedHook"},
    "logger": {"type": "LoggerHook"},
    "param_scheduler": {"type": "ParamSchedulerHook"},
    "checkpoint": {"type": "CheckpointHook", "interval": 1},
}
_BUILTIN_HOOK_KEYS = frozenset(_DEFAULT_HOOKS)
_BUILTIN_HOOK_TYPES = frozenset({
    "RuntimeInfoHook", "IterTimerHook", "DistSamplerSeedHook", "LoggerHook",
    "ParamSchedulerHook", "CheckpointHook", "SyncBuffersHook",
})


class RunnerView:
    """What a hook sees as ``runner``: the run's artifacts and its counters.

    Only hooks read it; steps fill it through :meth:`hold` alone and read
    nothing back. The loop sets ``epoch`` and ``iter``.
    """

    def __init__(self, cfg: Any, *, work_dir: str, log_dir: str, experiment_name: str,
                 timestamp: str, logger: MMLogger, message_hub: MessageHub,
                 resume: bool = False) -> None:
        self.cfg = cfg
        self._resume = resume
        self.work_dir = work_dir
        self.log_dir = log_dir
        self.timestamp = timestamp
        # MMEngine's: {experiment_name}_{timestamp}, the timestamp alone without a name.
        self.experiment_name = f"{experiment_name}_{timestamp}" if experiment_name else timestamp
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
        self._visualizer: Any = None
        self._default_visualizer: Callable[[], Any] | None = None
        self.seed: int | None = None
        self._resume = cfg is not None and resume_source(cfg) is not None  # MMEngine's
        self.epoch = 0
        self.iter = 0
        self.max_epochs = 0
        self.max_iters = 0
        self.val_interval = 1
        self.val_begin = 1

    _HELD = frozenset({"model", "optim_wrapper", "param_schedulers", "train_dataloader",
                       "val_dataloader", "test_dataloader", "val_evaluator",
                       "test_evaluator", "seed"})

    def hold(self, *, schedule: TrainSchedule | None = None, **artifacts: Any) -> None:
        """Show hooks the run's artifacts (a name not shown to hooks is a ``TypeError``)."""
        unknown = sorted(set(artifacts) - self._HELD)
        if unknown:
            raise TypeError(f"RunnerView.hold: {unknown[0]!r} is not shown to hooks; "
                            f"it holds {', '.join(sorted(self._HELD))}")
        for name, value in artifacts.items():
            setattr(self, name, value)
        if schedule is not None:
            self.max_epochs, self.max_iters = schedule.max_epochs, schedule.max_iters
            self.val_interval, self.val_begin = schedule.val_interval, schedule.val_begin
        if any(name.endswith("_dataloader") for name in artifacts):
            share_dataset_meta(self)

    @property
    def visualizer(self) -> Any:
        """The run's Visualizer (MMEngine's default one is built on first use)."""
        if self._visualizer is None and self._default_visualizer is not None:
            build, self._default_visualizer = self._default_visualizer, None
            self._visualizer = build()
            share_dataset_meta(self)
        return self._visualizer

    @visualizer.setter
    def visualizer(self, visualizer: Any) -> None:
        self._visualizer, self._default_visualizer = visualizer, None

    def built_visualizer(self) -> Any:
        """The Visualizer if one was built, without building MMEngine's default."""
        return self._visualizer

    def build_visualizer_on_first_use(self, build: Callable[[], Any]) -> None:
        self._visualizer, self._default_visualizer = None, build

    @property
    def rank(self) -> int:
        return this_rank()

    @property
    def world_size(self) -> int:
        return world_size()

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def train_loop(self) -> RunnerView:
        """MMEngine hooks read ``runner.train_loop.max_iters`` etc.; we are that too."""
        return self

    _train_loop = train_loop

    @property
    def dataloader(self) -> Any:
        return self.train_dataloader

    @property
    def val_loop(self) -> EvalLoopView:
        """MMEngine's ``runner.val_loop``: its dataloader, evaluator and ``run_iter``."""
        return EvalLoopView(self, "val")

    @property
    def test_loop(self) -> EvalLoopView:
        return EvalLoopView(self, "test")

    @property
    def _log_dir(self) -> str:
        return self.log_dir

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """MMEngine's ``Runner.call_hook``, for hooks that call other hooks."""
        self.hooks.call(fn_name, **kwargs)

    hooks: Hooks


class EvalLoopView:
    """What hooks see as ``runner.val_loop`` / ``runner.test_loop`` (MMEngine's ValLoop's parts)."""

    def __init__(self, runner: RunnerView, mode: str) -> None:
        self.runner, self.mode = runner, mode
        self.dataloader = getattr(runner, f"{mode}_dataloader")
        self.evaluator = getattr(runner, f"{mode}_evaluator")

    @torch.no_grad()
    def run_iter(self, idx: int, data_batch: Any) -> None:
        """One batch as MMEngine's ``ValLoop.run_iter``: hooks, ``val_step``, the evaluator."""
        self.runner.call_hook(f"before_{self.mode}_iter", batch_idx=idx, data_batch=data_batch)
        outputs = getattr(self.runner.model, f"{self.mode}_step")(data_batch)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook(f"after_{self.mode}_iter", batch_idx=idx, data_batch=data_batch,
                              outputs=outputs)


#: Runner attributes flexgraph does not give hooks, and what does their work instead.
_NOT_GIVEN = {
    "log_processor": "flexgraph writes the log lines itself (default_hooks.logger)",
    "save_checkpoint": "flexgraph saves through default_hooks.checkpoint",
    "train_loop.stop_training": "flexgraph's loop does not stop early",
}


def refuse_unknown_reads(hook: Any, what: str, runner: RunnerView) -> None:
    """Refuse, by name, a hook whose source reads a Runner attribute the view lacks:
    when built, rather than with an ``AttributeError`` mid-run."""
    known = {*dir(runner), "hooks"}
    loops = {"train_loop": known, "_train_loop": known,
             "val_loop": {*dir(EvalLoopView), "dataloader", "evaluator"}}
    loops["test_loop"] = loops["val_loop"]
    for cls in type(hook).__mro__:
        for name, inner in _runner_reads(cls):
            if inner and name in loops and inner not in loops[name]:
                name = f"{name}.{inner}"
            elif name in known:
                continue
            why = _NOT_GIVEN.get(name, "MMEngine's Runner has it, flexgraph's view does not")
            raise ConfigError(f"{what}: {cls.__name__} reads runner.{name}: {why}; "
                              f"remove the hook or override that method")


@functools.cache
def _runner_reads(cls: type) -> frozenset[tuple[str, str]]:
    """``(name, inner)`` of each ``runner.name[.inner]`` in ``cls``'s own source."""
    import ast
    import inspect
    import textwrap

    if cls in (Hook, object):
        return frozenset()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "runner":
            reads.add((node.attr, ""))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "runner":
            reads.add((node.value.attr, node.attr))
    return frozenset(reads)


def _overrides(hook: Any, point: str) -> bool:
    if not isinstance(hook, Hook):
        return callable(getattr(hook, point, None))
    if point in vars(hook):
        return True
    cls = type(hook)
    if getattr(cls, point) is not getattr(Hook, point):
        return True
    return any(point in points and getattr(cls, generic) is not getattr(Hook, generic)
               for generic, points in _DELEGATES.items())


class Hooks:
    """The run's hooks, sorted stably by priority as MMEngine's Runner sorts them.

    Each name in :data:`HOOK_POINTS` is an attribute: the tuple of bound methods
    of the hooks that override that point.
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
        """Fire ``before_run`` once per run: the first step that fires a hook calls it, as
        hooks such as EMA set up in ``before_run`` what ``after_load_checkpoint`` needs."""
        if not self._run_started:
            self._run_started = True
            self.call("before_run")

    def end_run(self) -> None:
        """Fire ``after_run``; the next :meth:`start_run` begins a new run."""
        self.call("after_run")
        self._run_started = False

    def __len__(self) -> int:
        return len(self.hooks)

    def hold(self, *, schedule: TrainSchedule | None = None, **artifacts: Any) -> None:
        """:meth:`RunnerView.hold`."""
        self.runner.hold(schedule=schedule, **artifacts)

    def built_visualizer(self) -> Any:
        """The Visualizer the hooks draw with, if one was built."""
        return self.runner.built_visualizer()

    def __repr__(self) -> str:
        return f"Hooks({[type(h).__name__ for h in self.hooks]})"


# mmengine.runner.Priority's levels: importing mmengine.runner imports every runner and
# strategy, DeepSpeed included; a test checks the values.
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


def _scheduler_hook_type() -> type:
    from mmengine.hooks import ParamSchedulerHook

    return ParamSchedulerHook


_NO_VISUALIZER_YET = "Visualizer.get_current_instance()"  # MMEngine's words for it


def _hook_from_cfg(cfg: Any, what: str, runner: RunnerView) -> Any:
    """Build one hook; MMDetection's ``SyncNormHook`` becomes flexgraph's (works on shards)."""
    hook = _built_hook(cfg, what, runner)
    if replaces(hook):
        mine = SyncNormHook()
        mine.priority = hook.priority
        return mine
    return hook


def _built_hook(cfg: Any, what: str, runner: RunnerView) -> Any:
    if not isinstance(cfg, dict) and not hasattr(cfg, "items"):
        refuse_unknown_reads(cfg, what, runner)
        return cfg  # an already-built hook object
    args = dict(cfg)
    priority = args.pop("priority", None)
    try:
        hook = build_from_cfg(args, HOOKS, what=what)
    except RuntimeError as exc:
        if _NO_VISUALIZER_YET not in str(exc) or runner.built_visualizer() is not None:
            raise
        runner.visualizer  # noqa: B018 (builds MMEngine's default visualizer)
        hook = build_from_cfg(args, HOOKS, what=what)
    if priority is not None:
        hook.priority = priority
    refuse_unknown_reads(hook, what, runner)
    return hook


def _is_builtin(key: str, cfg: Any) -> bool:
    """A default hook the loop implements (``checkpoint=dict(interval=1)`` counts too)."""
    type_ = cfg.get("type") if hasattr(cfg, "get") else type(cfg)
    if type_ is None:
        return key in _BUILTIN_HOOK_KEYS
    name = type_ if isinstance(type_, str) else getattr(type_, "__name__", "")
    return name.rpartition(".")[2] in _BUILTIN_HOOK_TYPES


def _default_hooks(cfg: Any) -> dict[str, Any]:
    """``default_hooks`` merged into MMEngine's defaults as ``Runner.register_default_hooks``
    merges them: ``None`` removes one, a value replaces it in place, new keys come last."""
    merged: dict[str, Any] = dict(_DEFAULT_HOOKS)
    for key, hook_cfg in section(cfg, "default_hooks", {}).items():
        if hook_cfg is None:
            merged.pop(key, None)
        else:
            merged[key] = hook_cfg
    return merged


def _builtin_hook(key: str, hook_cfg: Any, settings: RunSettings) -> Any:
    """The hook object standing in for a built-in default (``None``: the loop does it)."""
    if isinstance(hook_cfg, Hook):
        if type(hook_cfg).__name__ == "CheckpointHook":
            raise ConfigError(f"default_hooks.{key}: give the CheckpointHook as a dict of its "
                              f"options (dict(type='CheckpointHook', interval=...)); flexgraph "
                              f"saves through its own checkpointer")
        return hook_cfg if type(hook_cfg) is _scheduler_hook_type() else None
    name = type_name(hook_cfg)
    if name == "ParamSchedulerHook" or (not name and key == "param_scheduler"):
        hook = _scheduler_hook_type()()
    elif name == "CheckpointHook" or (not name and key == "checkpoint"):
        hook = BuiltinCheckpointHook(settings.checkpoint)
    else:
        return None
    if hook_cfg.get("priority") is not None:
        hook.priority = hook_cfg["priority"]
    return hook


def build_hooks(cfg: Any, settings: RunSettings, run_context: RunContext) -> Hooks:
    """Build the default hooks (MMEngine's, merged with ``default_hooks``) and ``custom_hooks``.

    Timer, logger, sampler seed and runtime info are done by the loop itself.
    Config keys flexgraph does not act on are reported here, once per run.
    """
    warn_unused_keys(cfg, rank=run_context.rank, world_size=run_context.world_size)
    runner = _runner_view(cfg, settings, run_context)
    hooks = []
    for key, hook_cfg in _default_hooks(cfg).items():
        if _is_builtin(key, hook_cfg):
            builtin = _builtin_hook(key, hook_cfg, settings)
            if builtin is not None:
                hooks.append(builtin)
            continue
        hooks.append(_hook_from_cfg(hook_cfg, f"default_hooks.{key}", runner))
    custom = section(cfg, "custom_hooks", [])
    if not isinstance(custom, (list, tuple)):
        raise ConfigError(f"custom_hooks must be a list of hook dicts, got {type(custom)}")
    hooks.extend(_hook_from_cfg(c, f"custom_hooks[{i}]", runner) for i, c in enumerate(custom))
    return Hooks(hooks, runner)


def _runner_view(cfg: Any, settings: RunSettings, run_context: RunContext) -> RunnerView:
    """The run's :class:`RunnerView`: the run context's log, and the run's visualizer."""
    runner = RunnerView(
        cfg,
        work_dir=settings.work_dir,
        log_dir=run_context.log_dir or settings.work_dir,
        experiment_name=settings.experiment_name,
        timestamp=run_context.timestamp,
        logger=run_context.logger,
        message_hub=run_context.message_hub,
        resume=settings.resume is not None,
    )
    run_number = next(_RUN_NUMBERS)
    build = functools.partial(build_visualizer, cfg, name=runner.experiment_name,
                              save_dir=runner.log_dir, run_number=run_number)
    if section(cfg, "visualizer") is None and not _a_visualizer_exists():
        # MMEngine's default (matplotlib) is slow to build: built when a hook first asks.
        # Once an earlier run of this process made one, hooks would get that one instead.
        runner.build_visualizer_on_first_use(build)
    else:
        runner.visualizer = build()
    return runner


def _a_visualizer_exists() -> bool:
    from mmengine.visualization import Visualizer

    try:
        Visualizer.get_current_instance()
    except RuntimeError:
        return False
    return True


def build_visualizer(cfg: Any, *, name: str, save_dir: str, run_number: int = 0) -> Any:
    """The run's Visualizer, built as MMEngine's ``Runner.build_visualizer`` builds it.

    A ``name`` an earlier run in this process took gets ``_<run_number>``
    appended, else MMEngine's ``get_instance`` would hand back that run's.
    """
    from mmengine.registry import VISUALIZERS
    from mmengine.visualization import Visualizer

    given = section(cfg, "visualizer")
    if given is None:  # MMEngine's default
        given = {"type": Visualizer, "vis_backends": [{"type": "LocalVisBackend"}]}
    if isinstance(given, Visualizer):
        visualizer = given
    elif isinstance(given, Mapping):
        args = _visualizer_args(given, name=name, save_dir=save_dir, run_number=run_number)
        visualizer = build_from_cfg(args, VISUALIZERS, what="visualizer")
        if not isinstance(visualizer, Visualizer):
            raise ConfigError(f"visualizer: type={args['type']!r} built a "
                              f"{type(visualizer).__name__}, not an mmengine Visualizer")
    else:
        raise ConfigError(f"visualizer must be a dict(type=...) or a Visualizer, got "
                          f"{type(given).__name__}")
    if _is_rank_zero():
        _check_tensorboard(visualizer)
        _record_config(visualizer, cfg)
    return visualizer


def _visualizer_args(given: Mapping[str, Any], *, name: str, save_dir: str,
                     run_number: int) -> dict[str, Any]:
    """The visualizer's build arguments; backends' types resolved here, so that a
    misspelled one gets a did-you-mean."""
    args = dict(given)
    args.setdefault("type", "Visualizer")
    args["name"] = _free_name(args.get("name") or name, run_number)
    args.setdefault("save_dir", save_dir)
    backends = args.get("vis_backends")
    if backends is not None:
        listed = [backends] if not isinstance(backends, (list, tuple)) else list(backends)
        args["vis_backends"] = [_backend_args(backend, f"visualizer.vis_backends[{i}]")
                                for i, backend in enumerate(listed)]
    return args


def _backend_args(backend: Any, what: str) -> Any:
    if not isinstance(backend, Mapping):
        return backend
    if "type" not in backend:
        raise ConfigError(f"{what}: {dict(backend)!r} has no type; name the backend, as "
                          f"dict(type='TensorboardVisBackend')")
    from mmengine.registry import VISBACKENDS

    return {**backend, "type": resolve_type(backend["type"], VISBACKENDS, what=what,
                                            scope=backend.get("_scope_"))}


def _free_name(name: str, run_number: int) -> str:
    """``name``, or ``name_<run_number>`` when an earlier visualizer took it (every
    Visualizer, of whatever subclass, is listed in ``Visualizer``'s instances)."""
    from mmengine.visualization import Visualizer

    return f"{name}_{run_number}" if Visualizer.check_instance_created(name) else name


def _is_rank_zero() -> bool:
    return launch_rank() == 0


def _backends(visualizer: Any) -> list[Any]:
    """The visualizer's backends (MMEngine keeps them in ``_vis_backends``, by name)."""
    return list(getattr(visualizer, "_vis_backends", {}).values())


def _check_tensorboard(visualizer: Any) -> None:
    """A ``TensorboardVisBackend`` without tensorboard fails now, as one line, rather
    than at its first event with MMEngine's ImportError."""
    from mmengine.visualization import TensorboardVisBackend

    if (any(isinstance(b, TensorboardVisBackend) for b in _backends(visualizer))
            and importlib.util.find_spec("tensorboard") is None):
        raise ConfigError("visualizer.vis_backends asks for TensorboardVisBackend, but "
                          "tensorboard is not installed: pip install tensorboard, or remove "
                          "that backend")


def _record_config(visualizer: Any, cfg: Any) -> None:
    """Give the config to every backend, as MMEngine's Runner does, but a
    ``LocalVisBackend``: the run folder's ``config.py`` already holds it."""
    from mmengine.config import Config
    from mmengine.visualization import LocalVisBackend

    if not isinstance(cfg, Config):
        return
    for backend in _backends(visualizer):
        if not isinstance(backend, LocalVisBackend):
            backend.add_config(cfg)


def share_dataset_meta(runner: RunnerView) -> None:
    """Give the visualizer the ``metainfo`` of the run's datasets, as MMEngine's loops do
    (the last one with a ``metainfo`` wins)."""
    visualizer = runner.built_visualizer()
    if visualizer is None:
        return
    for loader in (runner.train_dataloader, runner.val_dataloader, runner.test_dataloader):
        meta = getattr(getattr(loader, "dataset", None), "metainfo", None)
        if meta is not None:
            visualizer.dataset_meta = meta
