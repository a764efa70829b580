"""``--cfg-options K=V``: mmengine's override syntax, parsed by mmengine itself.

A command line that works with an OpenMMLab ``tools/train.py`` works here:
the items go through :class:`mmengine.config.DictAction` (dotted keys, ``[a,b]``
lists, ``true``/``None``...). mmengine is imported only when options are given,
so ``flexgraph plan`` on a YAML spec stays light.
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

    namespace = argparse.Namespace()
    DictAction(option_strings=["--cfg-options"], dest="options")(None, namespace, items)
    return dict(namespace.options)
