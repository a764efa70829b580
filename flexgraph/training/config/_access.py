"""How every reader of the config gets at a section and at a component's ``type``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["is_pretrained", "names_pretrained", "section", "type_name"]


def section(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a Config, ConfigDict or plain dict, ``default`` if absent.

    Parameters
    ----------
    cfg : Config or Mapping or None
        A config, or a section of one.
    key : str
        The key to read.
    default : Any, optional
        What an absent (or ``None``) key gives.

    Returns
    -------
    Any
        The value, or ``default``.
    """
    if cfg is None:
        return default
    value = cfg.get(key, default)
    return default if value is None else value


def type_name(cfg: Any) -> str:
    """The short name of a component config's ``type``.

    Parameters
    ----------
    cfg : Mapping or Any
        A component config; its ``type`` is a name, a dotted name or a class.

    Returns
    -------
    str
        The last part of the name; ``""`` when there is no ``type``.
    """
    type_ = cfg.get("type") if isinstance(cfg, Mapping) else None
    name = type_ if isinstance(type_, str) else getattr(type_, "__name__", "") or ""
    return name.rpartition(".")[2]


def is_pretrained(init_cfg: Any) -> bool:
    """Whether one ``init_cfg`` entry is MMEngine's ``Pretrained`` (by name or its class).

    Parameters
    ----------
    init_cfg : Any
        One entry of a module's ``init_cfg``.

    Returns
    -------
    bool
        It is a ``Pretrained`` initialiser.
    """
    return isinstance(init_cfg, Mapping) and type_name(init_cfg) in ("Pretrained",
                                                                       "PretrainedInit")


def names_pretrained(cfg: Any) -> bool:
    """Whether ``cfg.model`` names a ``Pretrained`` initialiser anywhere (nothing built).

    A class's own default ``init_cfg`` is not seen: only what the config writes.

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config.

    Returns
    -------
    bool
        Some ``init_cfg`` under ``cfg.model`` is a ``Pretrained``.
    """
    def walk(value: Any) -> bool:
        if is_pretrained(value):
            return True
        if isinstance(value, Mapping):
            return any(walk(v) for v in value.values())
        if isinstance(value, (list, tuple)):
            return any(walk(v) for v in value)
        return False

    return walk(section(cfg, "model"))
