"""``--cfg-options K=V``: mmengine's override syntax, parsed by mmengine's ``DictAction``.

mmengine is imported only when options are given.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from flexgraph.core.errors import FlexgraphError


class CfgOptionError(FlexgraphError, ValueError):
    """A ``--cfg-options`` item is not ``KEY=VALUE``."""


def parse_cfg_options(items: Iterable[str] | None) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into ``{"a.b": 1, "c": "x"}`` as mmengine does."""
    items = list(items or ())
    if not items:
        return {}
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise CfgOptionError(f"--cfg-options {item!r}: expected KEY=VALUE")
    from mmengine.config import DictAction

    options: dict[str, Any] = {}
    namespace = argparse.Namespace()
    parse = DictAction(option_strings=["--cfg-options"], dest="options")
    for item in items:  # one at a time, so that a refusal names its item
        try:
            parse(None, namespace, [item])
        except (AssertionError, RecursionError, ValueError, SyntaxError):
            # mmengine's parser asserts on unbalanced brackets and recurses without end
            # on a comma inside dict(...)
            raise CfgOptionError(
                f"--cfg-options {item!r}: mmengine cannot parse this value (unbalanced "
                f"brackets, or a comma inside dict(...)); set one key per item instead, "
                f"e.g. a.b=1 a.c=2, or write it in the config") from None
        options.update(namespace.options)
    return options
