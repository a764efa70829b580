"""Resolve ``type=`` in config dicts and build the component it names; an unknown name is
an :class:`UnknownComponentError` with a did-you-mean, not MMEngine's bare ``KeyError``."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from mmengine.registry import Registry

from flexgraph.core.errors import did_you_mean
from flexgraph.training.errors import ConfigError, UnknownComponentError

# The module that registers MMEngine's own components of a registry, imported only when
# a name misses: a run never imports ``mmengine.runner``, which imports every runner and
# strategy (DeepSpeed, when it is installed).
_REGISTERED_BY = {
    "dataset": "mmengine.dataset",
    "data sampler": "mmengine.dataset",
    "transform": "mmengine.dataset",
    "function": "mmengine.dataset",  # pseudo_collate, default_collate
    "model": "mmengine.model",
    "model_wrapper": "mmengine.model",
    "weight initializer": "mmengine.model",
    "optimizer": "mmengine.optim",
    "optim_wrapper": "mmengine.optim",
    "optimizer wrapper constructor": "mmengine.optim",
    "parameter scheduler": "mmengine.optim",
    "hook": "mmengine.hooks",
    "metric": "mmengine.evaluator",
    "evaluator": "mmengine.evaluator",
    "visualizer": "mmengine.visualization",
    "vis_backend": "mmengine.visualization",
}
_MMENGINE_MODULES = tuple(dict.fromkeys(_REGISTERED_BY.values()))


def _register_mmengine(registry: Registry) -> None:
    root = registry
    while root.parent is not None:  # a downstream scope's registry: its root is MMEngine's
        root = root.parent
    module = _REGISTERED_BY.get(root.name)
    for name in (module,) if module else _MMENGINE_MODULES:
        importlib.import_module(name)  # a no-op once imported


def registered_names(registry: Registry) -> list[str]:
    """Every name ``registry`` can resolve, sorted (a child scope's read ``scope.name``)."""
    _register_mmengine(registry)
    names: set[str] = set()
    node: Registry | None = registry
    while node is not None:
        names.update(node.module_dict)
        node = node.parent
    for scope, child in registry.children.items():
        names.update(f"{scope}.{name}" for name in child.module_dict)
    return sorted(names)


def resolve_type(type_: Any, registry: Registry, *, what: str = "",
                 scope: str | None = None) -> Any:
    """Return the class or function that ``type_`` names in ``registry``.

    Parameters
    ----------
    type_
        A registered name, a dotted import path, or a class or callable.
    registry, what
        ``what``: where the name came from, for messages.
    scope
        A config's ``_scope_``, looked up instead of the default scope.

    Returns
    -------
    type or callable
    """
    if not isinstance(type_, str):
        if callable(type_):
            return type_
        raise ConfigError(f"{what or registry.name}: type={type_!r} is neither a name nor a class")
    with _scoped(registry, scope) as scoped:
        obj = _get(scoped, type_)
        if obj is None:  # not registered by the config's own imports: maybe one of MMEngine's
            _register_mmengine(scoped)
            obj = _get(scoped, type_)
        if obj is None and "." in type_:
            obj = _import_object(type_)
        if obj is None:
            where = f"{what}: " if what else ""
            in_scope = f"{scoped.scope!r} scope's " if scoped.scope != "mmengine" else "mmengine's "
            raise UnknownComponentError(
                f"{where}type={type_!r} is not in the {in_scope}{registry.name!r} registry "
                f"and is not an importable 'package.module.Name'"
                f"{did_you_mean(type_, registered_names(scoped))}; register it with "
                f"@{_registry_constant(registry)}.register_module() in a module "
                f"listed in custom_imports, or give the full import path"
            )
    return obj


def _registry_constant(registry: Registry) -> str:
    """``registry``'s root's name in ``mmengine.registry`` (``MODELS``, not ``model``)."""
    from mmengine.registry import root

    while registry.parent is not None:
        registry = registry.parent
    return next((name for name, value in vars(root).items() if value is registry),
                registry.name.upper().replace(" ", "_"))


@contextlib.contextmanager
def _scoped(registry: Registry, scope: str | None) -> Iterator[Registry]:
    from mmengine.registry import DefaultScope

    if scope is None and DefaultScope.get_current_instance() is None:
        yield registry
        return
    with registry.switch_scope_and_registry(scope) as scoped:
        yield scoped


def _get(registry: Registry, type_: str) -> Any:
    try:
        return registry.get(type_)
    except (RuntimeError, ImportError, AttributeError, ValueError):
        return None


def _import_object(path: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, attr, None)


def build_from_cfg(
    cfg: Any,
    registry: Registry,
    *,
    default_args: Mapping[str, Any] | None = None,
    what: str = "",
) -> Any:
    """Build the component that ``cfg`` (a dict with ``type=``) describes; return anything else.

    Parameters
    ----------
    cfg, registry
    default_args : Mapping, optional
        Arguments the config's own override.
    what : str, default ''
        Where the config came from, for messages.

    Returns
    -------
    Any

    Examples
    --------
    >>> from mmengine.registry import MODELS
    >>> build_from_cfg(dict(type='torch.nn.Linear', in_features=2, out_features=1),
    ...                MODELS)
    Linear(in_features=2, out_features=1, bias=True)
    """
    if not isinstance(cfg, Mapping):
        return cfg
    if "type" not in cfg:
        raise ConfigError(
            f"{what or registry.name}: {dict(cfg)!r} has no 'type' key; "
            f"add type='<registered name or package.module.Class>'"
        )
    args = dict(cfg)
    scope = args.get("_scope_")
    args["type"] = resolve_type(args["type"], registry, what=what, scope=scope)
    try:
        return registry.build(args, default_args=dict(default_args or {}))
    except TypeError as exc:
        name = getattr(args["type"], "__name__", args["type"])
        raise ConfigError(f"{what or registry.name}: building {name} failed: {exc}") from exc
