"""The resolved config as a runnable ``.py`` file, spelled directly where its values are
literals (``Config.dump`` formats with yapf, slow at a run's start)."""

from __future__ import annotations

import keyword
import math
import unicodedata
from pathlib import Path
from typing import Any

from flexgraph.training.errors import ConfigError

WIDTH = 79
"""Columns a one-line value may take, as yapf's style in MMEngine's dump."""

_ATOMS = (bool, int, type(None))

_UNWRITABLE = frozenset({
    "_base_", "_deprecation_",  # mmengine.config.config's BASE_KEY, DEPRECATION_KEY
    "filename", "text", "pretty_text", "env_variables",  # and its RESERVED_KEYS
})
"""Top-level keys that ``Config.fromfile`` acts on or ``Config`` refuses."""


class _NotLiteral(Exception):
    """A value with no literal spelling."""


def _spell(value: Any, indent: int, start: int, tail: int = 1, calls: bool = True) -> str:
    """``value`` as Python source at column ``start``, keeping ``tail`` columns free."""
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, _ATOMS):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _NotLiteral(value)
        return repr(value)
    inner = indent + 4
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise _NotLiteral(value)
        if calls and all(_is_name(key) for key in value):
            items = [f"{key}={_spell(item, inner, inner + len(key) + 1, calls=calls)}"
                     for key, item in value.items()]
            return _enclose("dict(", items, ")", indent, start + tail)
        items = []
        for key, item in value.items():
            spelled = _string(key)
            items.append(f"{spelled}: "
                         f"{_spell(item, inner, inner + len(spelled) + 2, calls=calls)}")
        return _enclose("{", items, "}", indent, start + tail)
    if isinstance(value, (list, tuple)):
        items = [_spell(item, inner, inner, calls=calls) for item in value]
        if isinstance(value, list):
            return _enclose("[", items, "]", indent, start + tail)
        if len(items) == 1:
            return f"({items[0]},)"
        return _enclose("(", items, ")", indent, start + tail)
    raise _NotLiteral(value)


def _string(text: str) -> str:
    """``text`` as a literal ``Config.fromfile`` reads back: ``{`` spelled ``\\x7b`` in ``{{``."""
    spelled = repr(text)
    return spelled.replace("{", "\\x7b") if "{{" in spelled else spelled


def _is_name(key: str) -> bool:
    """Whether ``key`` reads back as itself in ``dict(key=...)``: Python reads identifiers
    in NFKC form."""
    return (key.isascii() and key.isidentifier() and not keyword.iskeyword(key)
            and key != "__debug__")


def _check_top_level(key: Any) -> None:
    if isinstance(key, str) and (key.startswith("__") or key in _UNWRITABLE):
        why = ("Config.fromfile drops top-level keys that start with '__'"
               if key.startswith("__") else
               "Config reserves it" if key not in ("_base_", "_deprecation_") else
               "Config.fromfile reads it as an instruction, not as a setting")
        raise ConfigError(f"the config's top-level key {key!r} cannot be written to "
                          f"config.py: {why}; rename it or move it into a section")


def _enclose(opening: str, items: list[str], closing: str, indent: int, taken: int) -> str:
    one_line = opening + ", ".join(items) + closing
    if "\n" not in one_line and taken + len(one_line) <= WIDTH:
        return one_line
    pad = " " * (indent + 4)
    return opening + "\n" + "".join(f"{pad}{item},\n" for item in items) + " " * indent + closing


def config_text(cfg: Any) -> str | None:
    """The config as runnable Python, or ``None`` when some value has no literal spelling.

    Parameters
    ----------
    cfg : Config

    Returns
    -------
    str or None
    """
    tree = cfg.to_dict()
    for key in tree:
        _check_top_level(key)
    calls = "dict" not in tree  # a top-level `dict = ...` hides the builtin
    globals_ = "globals()"
    statements = []
    try:
        for key, value in tree.items():
            if not isinstance(key, str):
                raise _NotLiteral(key)
            target = key if _is_name(key) else f"{globals_}[{_string(key)}]"
            spelled = _spell(value, 0, len(target) + 3, tail=0, calls=calls)
            statements.append(f"{target} = {spelled}\n")
            if key == "globals":  # the builtin is hidden from here on
                globals_ = "(lambda: None).__globals__"
    except _NotLiteral:
        return None
    return "".join(statements)


def write_config(cfg: Any, path: str | Path) -> None:
    """Write ``cfg`` to ``path`` as :func:`config_text` spells it, else with ``Config.dump``.

    Parameters
    ----------
    cfg, path
    """
    text = config_text(cfg)
    if text is not None:
        Path(path).write_text(text, encoding="utf-8")
        return
    for key in cfg.to_dict():
        if isinstance(key, str) and not (
                key.isidentifier() and not keyword.iskeyword(key) and key != "dict"
                and unicodedata.normalize("NFKC", key) == key):
            raise ConfigError(
                f"the config's top-level key {key!r} cannot be written to config.py: "
                "the config holds a value that only Config.dump spells (an object, a "
                "non-finite float, a key that is not a string), and Config.dump writes "
                "each top-level key as an assignment, which would not read back as "
                "this key (or, for 'dict', would hide the builtin the others call)")
    cfg.dump(str(path))
