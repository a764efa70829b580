"""The shape of each component section, checked before anything is built from it: a
mistake such as ``custom_hooks = ['MyHook']`` would otherwise surface deep in MMEngine."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from flexgraph.core.errors import did_you_mean
from flexgraph.training.config._access import section, type_name
from flexgraph.training.config._keys import DEFAULT_HOOK_TYPES, near_miss
from flexgraph.training.errors import ConfigError

DATALOADER_KEYS = ("train_dataloader", "val_dataloader", "test_dataloader")

#: MMEngine's ``train_cfg`` options; ``dynamic_intervals`` is reported as unused.
TRAIN_CFG_OPTIONS = frozenset({"type", "by_epoch", "max_epochs", "max_iters", "val_interval",
                               "val_begin", "dynamic_intervals"})

#: The options of MMEngine's ``CheckpointHook`` and ``LoggerHook``, which flexgraph implements.
HOOK_OPTIONS = {
    "CheckpointHook": frozenset({
        "type", "priority", "interval", "by_epoch", "save_optimizer", "save_param_scheduler",
        "out_dir", "max_keep_ckpts", "save_last", "save_best", "rule", "greater_keys",
        "less_keys", "file_client_args", "filename_tmpl", "backend_args", "published_keys",
        "save_begin", "async_save"}),
    "LoggerHook": frozenset({
        "type", "priority", "interval", "ignore_last", "interval_exp_name", "out_dir",
        "out_suffix", "keep_local", "file_client_args", "log_metric_by_epoch",
        "backend_args"}),
}

#: The options of MMEngine's own optimizer wrappers and of its default constructor.
OPTIM_WRAPPER_OPTIONS = {
    "OptimWrapper": frozenset({"type", "optimizer", "accumulative_counts", "clip_grad",
                               "paramwise_cfg", "constructor"}),
    "AmpOptimWrapper": frozenset({"type", "optimizer", "accumulative_counts", "clip_grad",
                                  "paramwise_cfg", "constructor", "loss_scale", "dtype",
                                  "use_fsdp"}),
}
_AMP_DTYPES = ("float16", "bfloat16", "float32", "float64")  # AmpOptimWrapper.valid_dtypes
_APEX = (
    "optim_wrapper.type='ApexOptimWrapper': NVIDIA Apex's apex.amp has been removed upstream; "
    "write type='AmpOptimWrapper' (torch.amp: dtype='float16' for O1/O2's fp16 with dynamic "
    "loss scaling, or dtype='bfloat16') and drop opt_level")


def check_sections(cfg: Any) -> None:
    """Refuse a malformed component section before any step builds one."""
    if cfg is None or not hasattr(cfg, "get"):
        return
    _check_top_level_keys(cfg)
    _check_train_cfg(section(cfg, "train_cfg"))
    _check_default_hooks(section(cfg, "default_hooks"))
    _check_custom_hooks(section(cfg, "custom_hooks"))
    _check_optim_wrapper(section(cfg, "optim_wrapper"))
    _check_param_scheduler(section(cfg, "param_scheduler"))
    for key in DATALOADER_KEYS:
        _check_dataloader(key, section(cfg, key))
    _check_randomness(section(cfg, "randomness"))


# -- helpers every section uses -------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _component(value: Any, where: str, example: str) -> None:
    """Refuse what is not a dict with ``type`` or a built object, naming the dict to write."""
    if isinstance(value, str):
        if value.startswith("dict(type="):  # what --cfg-options made of dict(type=X)
            name = value[len("dict(type="):-1].strip("'\"")
            raise ConfigError(f"{where}: {value!r} is a string (--cfg-options passes dict(...) "
                              f"as text); write dict(type={name!r}{example}) in the config")
        raise ConfigError(f"{where}: {value!r} is a string; write dict(type={value!r}{example})")
    if isinstance(value, Mapping):
        if "type" not in value:
            raise ConfigError(f"{where}: {dict(value)!r} has no 'type'; write "
                              f"dict(type='<registered name or package.module.Class>'{example})")
        return
    if value is None or isinstance(value, (int, float, bool, list, tuple)):
        raise ConfigError(f"{where}: {value!r} is not a component; write "
                          f"dict(type='<registered name>'{example})")


def _unknown_options(options: Mapping[str, Any], known: frozenset[str], where: str,
                     what: str) -> None:
    for option in options:
        if option not in known and option != "_scope_":  # MMEngine's registry scope
            raise ConfigError(f"{where}.{option} is not an option of {what}"
                              f"{did_you_mean(str(option), known)}; remove it or fix its name")


def _int_at_least(options: Mapping[str, Any], key: str, low: int | None, where: str) -> None:
    if key in options and options[key] is not None:
        value = options[key]
        if not _is_int(value) or (low is not None and value < low):
            at_least = f" >= {low}" if low is not None else ""
            raise ConfigError(f"{where}.{key} must be an integer{at_least}, got {value!r}")


def _bool(options: Mapping[str, Any], key: str, where: str) -> None:
    if key in options and not isinstance(options[key], bool):
        raise ConfigError(f"{where}.{key} must be True or False, got {options[key]!r}")


def _arguments(component: Mapping[str, Any], registry_name: str, where: str,
               extra: frozenset[str] = frozenset()) -> None:
    """Refuse a keyword the component's class does not take, where it resolves now."""
    import inspect

    import mmengine.registry

    from flexgraph.core.errors import FlexgraphError
    from flexgraph.training.config._build import resolve_type

    registry = getattr(mmengine.registry, registry_name)
    try:
        cls = resolve_type(component["type"], registry, scope=component.get("_scope_"))
        parameters = inspect.signature(cls).parameters.values()
    except (FlexgraphError, TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    known = frozenset({p.name for p in parameters} | extra | {"type", "_scope_"})
    _unknown_options(component, known, where, getattr(cls, "__name__", str(cls)))


def _mapping(value: Any, where: str, example: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a dict, got {value!r}; write {where}={example}")
    return value


# -- the sections ---------------------------------------------------------------------------

def _check_top_level_keys(cfg: Any) -> None:
    """A misspelled section would train without it (``param_schedular``: a constant rate)."""
    for key in cfg:
        meant = near_miss(key)
        if meant is not None:
            raise ConfigError(f"config key {key!r} is not one flexgraph knows: did you mean "
                              f"{meant!r}? (a variable of your own: name it '_{key}')")


def _check_train_cfg(train_cfg: Any) -> None:
    if train_cfg is None:
        return
    options = _mapping(train_cfg, "train_cfg", "dict(by_epoch=True, max_epochs=...)")
    _unknown_options(options, TRAIN_CFG_OPTIONS, "train_cfg", "MMEngine's train loops")
    for key in ("max_epochs", "max_iters", "val_interval"):
        _int_at_least(options, key, 1, "train_cfg")
    _int_at_least(options, "val_begin", 0, "train_cfg")
    _bool(options, "by_epoch", "train_cfg")


def _check_default_hooks(default_hooks: Any) -> None:
    if default_hooks is None:
        return
    hooks = _mapping(default_hooks, "default_hooks",
                     "dict(checkpoint=dict(type='CheckpointHook', interval=1))")
    for key, hook in hooks.items():
        where = f"default_hooks.{key}"
        if hook is None:
            continue  # removes MMEngine's default hook of that name
        if isinstance(hook, Mapping) and "type" not in hook and key in DEFAULT_HOOK_TYPES:
            hook = dict(hook, type=DEFAULT_HOOK_TYPES[key])  # options of MMEngine's default
        _component(hook, where, "")
        known = HOOK_OPTIONS.get(type_name(hook)) if isinstance(hook, Mapping) else None
        if known is None:
            continue  # a hook of the user's: its options are its own
        _unknown_options(hook, known, where, f"MMEngine's {type_name(hook)}")
        # a CheckpointHook's interval <= 0 saves at the end only, a LoggerHook's must be >= 1
        _int_at_least(hook, "interval", None if type_name(hook) == "CheckpointHook" else 1,
                      where)
        _int_at_least(hook, "max_keep_ckpts", -1, where)
        _int_at_least(hook, "save_begin", 0, where)
        for flag in ("by_epoch", "save_last", "ignore_last"):
            _bool(hook, flag, where)


def _check_custom_hooks(custom_hooks: Any) -> None:
    if custom_hooks is None:
        return
    if not isinstance(custom_hooks, (list, tuple)):
        raise ConfigError(f"custom_hooks must be a list of hook dicts, got {custom_hooks!r}; "
                          f"write custom_hooks=[dict(type=...)]")
    for i, hook in enumerate(custom_hooks):
        _component(hook, f"custom_hooks[{i}]", "")
        if isinstance(hook, Mapping):
            _arguments(hook, "HOOKS", f"custom_hooks[{i}]", extra=frozenset({"priority"}))


def _check_optim_wrapper(optim_wrapper: Any) -> None:
    if optim_wrapper is None or not isinstance(optim_wrapper, (Mapping, str)):
        return  # absent (refused where it is needed), or a built wrapper
    if isinstance(optim_wrapper, str):
        raise ConfigError(f"optim_wrapper: {optim_wrapper!r} is a string; write "
                          f"optim_wrapper=dict(optimizer=dict(type='AdamW', lr=...))")
    kind = type_name(optim_wrapper) or "OptimWrapper"
    if kind == "ApexOptimWrapper":
        raise ConfigError(_APEX)
    if "optimizer" not in optim_wrapper and "constructor" not in optim_wrapper:
        raise ConfigError("optim_wrapper has no 'optimizer'; write "
                          "optim_wrapper=dict(optimizer=dict(type='AdamW', lr=...))")
    if "optimizer" in optim_wrapper:
        _check_optimizer(optim_wrapper["optimizer"])
    known = OPTIM_WRAPPER_OPTIONS.get(kind)
    if known is not None and "constructor" not in optim_wrapper:
        _unknown_options(optim_wrapper, known, "optim_wrapper", f"MMEngine's {kind}")
    _int_at_least(optim_wrapper, "accumulative_counts", 1, "optim_wrapper")
    clip = optim_wrapper.get("clip_grad")
    if clip is not None and not isinstance(clip, Mapping):
        raise ConfigError(f"optim_wrapper.clip_grad must be a dict of clip_grad_norm_'s "
                          f"arguments, got {clip!r}; write clip_grad=dict(max_norm={clip!r})")
    dtype = optim_wrapper.get("dtype")
    if kind == "AmpOptimWrapper" and isinstance(dtype, str) and dtype not in _AMP_DTYPES:
        raise ConfigError(f"optim_wrapper.dtype={dtype!r} is not one of 'float16', 'bfloat16' "
                          f"(or None: float16 on CUDA, bfloat16 on a CPU)")


def _check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, (Mapping, str)):
        return  # a built torch optimizer
    _component(optimizer, "optim_wrapper.optimizer", ", lr=...")
    _arguments(optimizer, "OPTIMIZERS", "optim_wrapper.optimizer", extra=frozenset({"params"}))
    for key in ("lr", "weight_decay", "momentum"):
        value = optimizer.get(key)
        if value is not None and (not _is_number(value) or value < 0):
            raise ConfigError(f"optim_wrapper.optimizer.{key} must be a number >= 0, got "
                              f"{value!r}")


def _scheduler_entries(param_scheduler: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(param_scheduler, Mapping) and "type" not in param_scheduler:
        groups = [(f"param_scheduler[{name!r}]", value)
                  for name, value in param_scheduler.items()]  # one list per optimizer
    else:
        groups = [("param_scheduler", param_scheduler)]
    for where, group in groups:
        if isinstance(group, (list, tuple)):
            yield from ((f"{where}[{i}]", entry) for i, entry in enumerate(group))
        else:
            yield where, group


def _check_param_scheduler(param_scheduler: Any) -> None:
    if not param_scheduler:
        return
    for where, entry in _scheduler_entries(param_scheduler):
        _component(entry, where, "")
        if not isinstance(entry, Mapping):
            continue
        _bool(entry, "by_epoch", where)
        _int_at_least(entry, "begin", 0, where)
        _int_at_least(entry, "end", 1, where)
        begin, end = entry.get("begin", 0), entry.get("end")
        if _is_int(end) and _is_int(begin) and end <= begin:
            raise ConfigError(f"{where}: end={end} must be after begin={begin}")


def _dataloader_options() -> frozenset[str]:
    import inspect

    from torch.utils.data import DataLoader

    torch_args = set(inspect.signature(DataLoader.__init__).parameters) - {"self"}
    return frozenset(torch_args | {"dataset", "disable_subprocess_warning"})


def _check_dataloader(key: str, loader: Any) -> None:
    if loader is None or not isinstance(loader, (Mapping, str, int, float, list, tuple)):
        return  # absent, or a built DataLoader
    options = _mapping(loader, key, "dict(batch_size=..., dataset=dict(type=...))")
    if "dataset" not in options:
        raise ConfigError(f"{key} has no 'dataset'; add dataset=dict(type=...)")
    _component(options["dataset"], f"{key}.dataset", "")
    _unknown_options(options, _dataloader_options(), key, "a dataloader")
    _int_at_least(options, "batch_size", 1, key)
    _int_at_least(options, "num_workers", 0, key)
    for flag in ("shuffle", "drop_last", "persistent_workers", "pin_memory"):
        _bool(options, flag, key)
    if isinstance(options.get("sampler"), (str, int, list, tuple)):
        _component(options["sampler"], f"{key}.sampler", ", shuffle=True")


def _check_randomness(randomness: Any) -> None:
    if randomness is None:
        return
    options = _mapping(randomness, "randomness", "dict(seed=0)")
    seed = options.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ConfigError(f"randomness.seed must be an integer >= 0 (or None), got {seed!r}")
    _bool(options, "deterministic", "randomness")
    _bool(options, "diff_rank_seed", "randomness")
