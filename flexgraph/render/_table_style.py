"""The one look of every table view (a rule under the header, no frame, flush left)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from rich import box

TABLE_STYLE: Mapping[str, Any] = MappingProxyType({
    "box": box.SIMPLE_HEAD,
    "title_justify": "left",
    "caption_justify": "left",
    "pad_edge": False,
    "show_edge": False,
    "collapse_padding": True,
})
"""Keyword arguments of :class:`rich.table.Table` that every table view passes."""
