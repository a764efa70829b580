"""The one look of every table view: a rule under the header, no frame, text flush left.

The plan table, the diff and the timings can print one after another in the
same terminal; passing them the same :class:`rich.table.Table` arguments keeps
them alike, and as narrow as their text allows (no edge, no padding at the
ends of a row, the padding of neighbouring cells collapsed into one).
"""

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
