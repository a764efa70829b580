"""How every reader of the config gets at a section and at a component's ``type``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["section", "type_name"]


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
