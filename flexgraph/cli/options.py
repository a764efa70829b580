"""``--cfg-options K=V``: mmengine's override syntax, parsed without mmengine.

Values are Python literals when they parse as one (``1``, ``0.1``, ``True``,
``[1, 2]``, ``'x'``), else plain strings; ``a=1,2`` is the list ``[1, 2]``
like mmengine's DictAction. Keys may be dotted (``optim_wrapper.optimizer.lr``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from flexgraph.core.errors import FlexgraphError


class OptionSyntaxError(FlexgraphError, ValueError):
    """A ``--cfg-options`` item is not ``KEY=VALUE``."""


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if "," in text and not text.startswith(("[", "(", "{")):
            return [_value(part) for part in text.split(",")]
        return text


def parse_cfg_options(items: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into ``{"a.b": 1, "c": "x"}``."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise OptionSyntaxError(f"--cfg-options {item!r}: expected KEY=VALUE")
        options[key] = _value(text)
    return options
