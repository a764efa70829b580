"""Which submodules to shard (or checkpoint) on their own: MMEngine's wrap policies.

MMEngine's FSDP configs choose units with FSDP1 auto-wrap policies; FSDP2 has none, so
:func:`wrap_units` walks the model as FSDP1's recursive wrapping did.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from flexgraph.core.errors import did_you_mean
from flexgraph.training.errors import ConfigError

__all__ = ["checkpoint_activations", "checkpoint_selected", "resolve_wrap_policy", "wrap_units"]

Policy = Callable[..., bool]


def _classes_by_name(model: nn.Module, names: Any, what: str) -> tuple[type, ...]:
    """The classes ``names`` gives (classes or names of ``model``'s module classes)."""
    present = {type(m).__name__: type(m) for m in model.modules()}
    classes = []
    for item in names if isinstance(names, (list, tuple, set)) else [names]:
        if isinstance(item, type):
            classes.append(item)
        elif item in present:
            classes.append(present[item])
        else:
            raise ConfigError(
                f"{what}: the model has no module of class {item!r}"
                f"{did_you_mean(str(item), present)}; name a class the model is built of")
    return tuple(classes)


def resolve_wrap_policy(policy: Any, model: nn.Module, *, what: str) -> Policy | None:
    """A policy function from a config value (name, dotted path, dict, callable or None)."""
    from mmengine.registry import FUNCTIONS

    from flexgraph.training.config import resolve_type

    if policy is None or callable(policy):
        return policy
    if isinstance(policy, str):
        return resolve_type(policy, FUNCTIONS, what=what)
    if not isinstance(policy, Mapping) or "type" not in policy:
        raise ConfigError(f"{what} must be a function name, dict(type=..., ...) or None, "
                          f"not {policy!r}")
    kwargs = dict(policy)
    fn = resolve_type(kwargs.pop("type"), FUNCTIONS, what=what)
    if "transformer_layer_cls" in kwargs:
        kwargs["transformer_layer_cls"] = set(_classes_by_name(
            model, kwargs["transformer_layer_cls"], f"{what}.transformer_layer_cls"))
    if "min_num_params" in kwargs:
        kwargs["min_num_params"] = int(kwargs["min_num_params"])
    return functools.partial(fn, **kwargs)


def wrap_units(model: nn.Module, policy: Policy | None) -> list[nn.Module]:
    """The submodules FSDP1's auto-wrapping would have wrapped, innermost first, root not."""
    if policy is None:
        return []
    units: list[nn.Module] = []

    def visit(module: nn.Module, is_root: bool) -> int:
        """Wrap what the policy says below ``module``; returns the parameters wrapped."""
        numel = sum(p.numel() for p in module.parameters())
        if not policy(module=module, recurse=True, nonwrapped_numel=numel):
            return 0
        wrapped = sum(visit(child, False) for child in module.children())
        remaining = numel - wrapped
        if not is_root and policy(module=module, recurse=False, nonwrapped_numel=remaining):
            units.append(module)
            return numel
        return wrapped

    visit(model, True)
    return units


def checkpoint_activations(model: nn.Module, check_fn: Callable[[nn.Module], bool]) -> int:
    """Recompute in backward the activations of every submodule ``check_fn`` selects; how many.

    torch's composable ``checkpoint`` keeps the state dict keys.
    """
    from torch.distributed._composable import checkpoint

    chosen = [m for m in model.modules() if m is not model and check_fn(m)]
    for module in chosen:
        checkpoint(module)
    return len(chosen)


def checkpoint_selected(model: nn.Module, options: Mapping[str, Any],
                        auto_wrap_policy: Any = None) -> int:
    """Activation checkpointing as MMEngine's FSDP configs ask for it; how many modules.

    Without ``options['check_fn']``: the units ``auto_wrap_policy`` shards.
    """
    from mmengine.registry import FUNCTIONS

    from flexgraph.training.config import build_from_cfg, resolve_type

    extra = sorted(set(options) - {"check_fn"})
    if extra:
        raise ConfigError(f"activation_checkpointing.{extra[0]} is not supported; "
                          f"activation_checkpointing takes check_fn")
    check_fn = options.get("check_fn")
    what = "activation_checkpointing.check_fn"
    if isinstance(check_fn, Mapping):
        check_fn = build_from_cfg(check_fn, FUNCTIONS, what=what)
    elif isinstance(check_fn, str):
        check_fn = resolve_type(check_fn, FUNCTIONS, what=what)
    if check_fn is None:
        units = wrap_units(model, resolve_wrap_policy(
            auto_wrap_policy, model, what="model_wrapper.auto_wrap_policy"))
        if not units:
            raise ConfigError("activation_checkpointing without a check_fn checkpoints the "
                              "wrap policy's units, and there are none; set check_fn or "
                              "model_wrapper.auto_wrap_policy")
        chosen = {id(u) for u in units}

        def check_fn(module: nn.Module) -> bool:
            return id(module) in chosen

    return checkpoint_activations(model, check_fn)
