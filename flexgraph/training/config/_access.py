"""How every reader of the config gets at a section and at a component's ``type``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def section(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` for a Config, ConfigDict or plain dict, ``default`` if absent or ``None``.

    Parameters
    ----------
    cfg, key, default

    Returns
    -------
    Any
    """
    if cfg is None:
        return default
    value = cfg.get(key, default)
    return default if value is None else value


def type_name(cfg: Any) -> str:
    """The last part of a component config's ``type`` name or class name (``""`` if none).

    Parameters
    ----------
    cfg : Mapping or Any

    Returns
    -------
    str
    """
    type_ = cfg.get("type") if isinstance(cfg, Mapping) else None
    name = type_ if isinstance(type_, str) else getattr(type_, "__name__", "") or ""
    return name.rpartition(".")[2]


def is_pretrained(init_cfg: Any) -> bool:
    """Whether one ``init_cfg`` entry is MMEngine's ``Pretrained``.

    Parameters
    ----------
    init_cfg : Any

    Returns
    -------
    bool
    """
    return isinstance(init_cfg, Mapping) and type_name(init_cfg) in ("Pretrained",
                                                                       "PretrainedInit")


def names_pretrained(cfg: Any) -> bool:
    """Whether ``cfg.model`` writes a ``Pretrained`` initialiser anywhere (not class defaults).

    Parameters
    ----------
    cfg : Config or Mapping

    Returns
    -------
    bool
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
