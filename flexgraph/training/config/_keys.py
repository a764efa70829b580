"""Which config keys flexgraph acts on, a warning naming each one it does not, and the
refusal of a typo of a known section (``param_schedular``)."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from flexgraph.training.config._access import section, type_name
from flexgraph.training.errors import UnusedConfigWarning

#: Top-level keys flexgraph acts on (MMEngine's meaning, where MMEngine has the key).
#: ``visualizer`` is built as MMEngine builds it, every option and backend included.
ACTED_ON = frozenset({
    "model", "data_preprocessor", "work_dir", "experiment_name",
    "train_dataloader", "val_dataloader", "test_dataloader",
    "train_cfg", "val_cfg", "test_cfg", "val_evaluator", "test_evaluator",
    "optim_wrapper", "param_scheduler", "default_hooks", "custom_hooks",
    "load_from", "resume", "randomness", "env_cfg", "log_level", "default_scope",
    "launcher", "auto_scale_lr", "compile", "visualizer", "log_processor",
    "find_unused_parameters",  # DDP's wrapper option, unless the strategy gives it
    # flexgraph's own: the graph and its strategies (spec front end), imports
    "strategy", "strategies", "steps", "custom_steps", "inputs", "custom_imports",
})

#: Top-level MMEngine keys flexgraph does not act on, with the reason shown.
NOT_ACTED_ON = {
    "model_wrapper_cfg": "give DDP options as strategy=dict(type='DDPStrategy', "
                         "model_wrapper=dict(...))",
    "activation_checkpointing": "flexgraph has no top-level activation checkpointing; "
                                "FSDPStrategy takes activation_checkpointing",
    "efficient_conv_bn_eval": "not supported",
    "tta_model": "test-time augmentation is not supported",
    "tta_pipeline": "test-time augmentation is not supported",
}

#: Options of the sections whose meaning flexgraph implements itself. A default
#: hook missing here (or given another ``type``) is built and run as a hook.
_SECTION_OPTIONS: dict[str, dict[str, frozenset[str] | str]] = {
    "train_cfg": {
        "acted": frozenset({"type", "by_epoch", "max_epochs", "max_iters", "val_interval",
                            "val_begin"}),
        "why": "flexgraph validates every val_interval from val_begin",
    },
    "randomness": {
        "acted": frozenset({"seed", "deterministic", "diff_rank_seed"}),
        "why": "not supported",
    },
    "env_cfg": {
        "acted": frozenset({"cudnn_benchmark", "stall_timeout", "shutdown_timeout"}),
        "why": "the launcher and the strategy set up processes (strategy=dict(dist_cfg=...))",
    },
    "val_cfg": {"acted": frozenset({"type"}), "why": "flexgraph's validation pass has no options"},
    "test_cfg": {"acted": frozenset({"type"}), "why": "flexgraph's test pass has no options"},
}
_HOOK_OPTIONS: dict[str, frozenset[str]] = {
    "CheckpointHook": frozenset({
        "type", "priority", "interval", "by_epoch", "max_keep_ckpts", "save_last",
        "save_begin", "save_best", "rule", "greater_keys", "less_keys", "published_keys",
        "async_save",
    }),
    "LoggerHook": frozenset({"type", "priority", "interval", "ignore_last",
                             "log_metric_by_epoch"}),
    "ParamSchedulerHook": frozenset({"type", "priority"}),
    "RuntimeInfoHook": frozenset({"type", "priority"}),
    "IterTimerHook": frozenset({"type", "priority"}),
    "DistSamplerSeedHook": frozenset({"type", "priority"}),
}
_HOOK_OPTION_WHY = {
    "CheckpointHook": "checkpoints go to work_dir under MMEngine's names and always hold the "
                      "optimizer and schedulers, so that resume is exact",
    "LoggerHook": "the loop writes flexgraph's log lines and metrics.jsonl and hands the "
                  "scalars to the visualizer's backends itself",
}
#: MMEngine's default hooks: the ``type`` each ``default_hooks`` key has when it gives none.
DEFAULT_HOOK_TYPES = {"runtime_info": "RuntimeInfoHook", "timer": "IterTimerHook",
                       "sampler_seed": "DistSamplerSeedHook", "logger": "LoggerHook",
                       "param_scheduler": "ParamSchedulerHook", "checkpoint": "CheckpointHook"}
_LOOP_TYPES = {"val_cfg": "ValLoop", "test_cfg": "TestLoop"}
_TYPO_CUTOFF = 0.85  # difflib ratio: 'param_schedular' ~ 0.93, 'train_pipeline' < 0.7


def near_miss(key: str) -> str | None:
    """The key flexgraph acts on that ``key`` misspells, if any (only those: MMPreTrain's
    ``test_pipeline`` is as close to the unsupported ``tta_pipeline``)."""
    if key in ACTED_ON or key in NOT_ACTED_ON or key.startswith("_"):
        return None
    close = difflib.get_close_matches(key, sorted(ACTED_ON), n=1, cutoff=_TYPO_CUTOFF)
    # a longer name of its own (MMDetection's 'val_evaluator_abs') is no typo
    return close[0] if close and abs(len(close[0]) - len(key)) <= 2 else None


def unused_keys(cfg: Any, *, world_size: int = 1) -> Iterator[str]:
    """One message per config key flexgraph does not act on, naming the key and why."""
    for key in cfg:
        value = cfg.get(key)
        if key in NOT_ACTED_ON and value not in (None, False, {}, []):
            yield f"config key {key!r} is not used by flexgraph: {NOT_ACTED_ON[key]}"
    yield from _conditional(cfg)
    for name, rules in _SECTION_OPTIONS.items():
        options = section(cfg, name, {})
        if not isinstance(options, Mapping):
            continue
        for option in options:
            if option in rules["acted"] or _acted_conditionally(name, option, world_size):
                continue
            yield f"config key '{name}.{option}' is not used by flexgraph: {rules['why']}"
        loop = _LOOP_TYPES.get(name)
        if loop and type_name(options) not in ("", loop):
            yield (f"config key '{name}.type' ({type_name(options)}) is not used by "
                   f"flexgraph: it runs its own {loop[:-4].lower()} pass")
    yield from _hook_options(cfg)


def _conditional(cfg: Any) -> Iterator[str]:
    launcher = section(cfg, "launcher", "none")
    if launcher not in ("none", "pytorch", "slurm"):  # the CLI reads those (cli/slurm.py)
        yield (f"config key 'launcher' ({launcher!r}) is not used by flexgraph: start "
               f"several processes with --nproc-per-node, torchrun or srun")
    scale = section(cfg, "auto_scale_lr", {})
    if isinstance(scale, Mapping) and scale.get("enable"):
        yield ("config key 'auto_scale_lr' is not used by flexgraph: scale the learning rate "
               "in optim_wrapper yourself")


def _acted_conditionally(name: str, option: str, world_size: int) -> bool:
    return name == "env_cfg" and option == "dist_cfg" and world_size == 1


def _hook_options(cfg: Any) -> Iterator[str]:
    for key, hook_cfg in section(cfg, "default_hooks", {}).items():
        if not isinstance(hook_cfg, Mapping):
            continue
        hook_type = type_name(hook_cfg) or DEFAULT_HOOK_TYPES.get(key, "")
        acted = _HOOK_OPTIONS.get(hook_type)
        if acted is None:
            continue  # a hook flexgraph builds and runs: its options are its own
        for option in hook_cfg:
            if option not in acted:
                why = _HOOK_OPTION_WHY.get(hook_type, "flexgraph's loop does this hook's work")
                yield f"config key 'default_hooks.{key}.{option}' is not used by flexgraph: {why}"


def warn_unused_keys(cfg: Any, *, rank: int = 0, world_size: int = 1) -> None:
    """Warn (:class:`UnusedConfigWarning`) about each unused key, on rank 0 only.

    Parameters
    ----------
    cfg, rank, world_size
    """
    if cfg is None or not hasattr(cfg, "get") or rank != 0:
        return
    for message in unused_keys(cfg, world_size=world_size):
        warnings.warn(message, UnusedConfigWarning, stacklevel=3)
