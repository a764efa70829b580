"""Views of a memory estimate (the ``flexgraph.estimate/1`` object): text and JSON.

They read the dict :meth:`Estimate.as_dict` makes, so this layer stays free of
torch; the schema is in ``docs/guide/memory.rst``. Sizes print in decimal units
(GB = 10^9 bytes, as GPU makers state a card's memory), each table in the unit
of its largest figure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from flexgraph.render._changes import derivation_lines
from flexgraph.render._table_style import TABLE_STYLE

_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers")


UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "KB"))


def size_unit(largest: float) -> tuple[float, str]:
    """The decimal unit to print sizes up to ``largest`` bytes in: ``(bytes, name)``."""
    return next(((size, name) for size, name in UNITS if largest >= size), UNITS[-1])


def in_unit(value: int | None, unit: tuple[float, str]) -> str:
    """``value`` bytes in ``unit`` (two decimals for GB, one below), ``-`` for none."""
    if value is None:
        return "-"
    return f"{value / unit[0]:.{2 if unit[1] == 'GB' else 1}f}"


def size_text(value: int | None) -> str:
    """``value`` bytes in its own unit: ``"96.1 KB"``; ``"0"``, and ``"-"`` for none."""
    if not value:
        return "-" if value is None else "0"
    return f"{in_unit(value, size_unit(value))} {size_unit(value)[1]}"


def count_text(value: int) -> str:
    """A parameter count: ``"9.6 K"``, ``"632.0 M"``, or the number itself below 1,000."""
    for size, name in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= size:
            return f"{value / size:,.1f} {name}"
    return str(value)


def _parameters(estimate: Mapping[str, Any]) -> Group:
    params = estimate["parameters"]
    line = Text(f"parameters: {count_text(params['total'])} total, "
                f"{count_text(params['trainable'])} trainable, "
                f"{count_text(params['frozen'])} frozen")
    table = Table(**TABLE_STYLE)
    table.add_column("module")
    table.add_column("parameters", justify="right")
    table.add_column("trainable", justify="right")
    for row in params["by_module"]:
        table.add_row(row["module"], count_text(row["total"]), count_text(row["trainable"]))
    return Group(line, table)


def _candidates(estimate: Mapping[str, Any]) -> Group:
    device = estimate.get("device_memory") or {}
    unit = size_unit(max(row["peak_bytes"] for row in estimate["candidates"]))
    title = (f"per-rank peak ({unit[1]}), {estimate['world_size']} rank(s), batch "
             f"{estimate['batch_size']} per rank, {estimate['optimizer']}")
    table = Table(title=title, **TABLE_STYLE)
    for name in ("candidate", "peak", *_PARTS, "phase"):
        table.add_column(name + ("*" if name == "buffers" else ""),
                         justify="left" if name in ("candidate", "phase") else "right")
    if device:
        table.add_column(f"fits {device['bytes'] / 1e9:.1f} GB")
    for row in estimate["candidates"]:
        cells = [row["candidate"], in_unit(row["peak_bytes"], unit),
                 *(in_unit(row["parts"][p], unit) for p in _PARTS), row["phase"]]
        if device:
            cells.append({True: "yes", False: "NO", None: "?"}[row.get("fits")])
        table.add_row(*cells)
    notes = ["* modelled from the strategy's options; the rest counted (activations on "
             f"one step traced on the meta device, {estimate['seconds']:.1f} s)"]
    if device:
        notes.append(f"device: {device['source']}; fits = peak <= "
                     f"{1 - device['margin']:.0%} of it")
    for row in estimate["candidates"]:
        notes += [f"{row['candidate']}: {note}" for note in row["notes"]]
    return Group(table, Text("\n".join(notes)))


def _setup(estimate: Mapping[str, Any]) -> Group:
    host = estimate.get("host_memory") or {}
    per_node = host.get("processes_per_node", estimate["world_size"])
    rows = [row for row in estimate["candidates"] if row.get("setup") is not None]
    nodes = {row["candidate"]: row["setup"].get("node_bytes", row["setup"]["rank0_bytes"] + (
        per_node - 1) * row["setup"]["other_bytes"]) for row in rows}
    unit = size_unit(max(nodes.values()))
    table = Table(title=f"setup's host memory ({unit[1]}), {per_node} rank(s) per node",
                  **TABLE_STYLE)
    for name in ("candidate", "rank 0", "each other rank", "node"):
        table.add_column(name, justify="left" if name == "candidate" else "right")
    if host:
        table.add_column(f"fits {host['bytes'] / 1e9:.1f} GB")
    notes = []
    for row in rows:
        setup = row["setup"]
        cells = [row["candidate"], in_unit(setup["rank0_bytes"], unit),
                 in_unit(setup["other_bytes"], unit), in_unit(nodes[row["candidate"]], unit)]
        if host:
            cells.append("yes" if setup.get("fits") else "NO")
        table.add_row(*cells)
        notes += [f"{row['candidate']}: {note}" for note in setup["notes"]]
    if host:
        notes.insert(0, f"setup: until the optimizer is built; host: {host['source']}; node = "
                        f"rank 0 + {per_node - 1} other rank(s); fits = node <= "
                        f"{1 - host['margin']:.0%} of it")
    if estimate.get("weights_loaded"):
        notes.insert(0, "the files loaded set every state_dict entry: init_weights is "
                        "pruned where the strategy may (its notes say so)")
    return Group(table, Text("\n".join(notes)))


def estimate_view(estimate: Mapping[str, Any]) -> Group:
    """The parameter census, the candidates' peaks, their setup on the host, and plan changes."""
    parts: list[Any] = [_parameters(estimate), Text(""), _candidates(estimate)]
    if any(row.get("setup") for row in estimate["candidates"]):
        parts += [Text(""), _setup(estimate)]
    if estimate.get("untraceable"):
        parts.insert(0, Text(f"note: {estimate['untraceable']}"))
    if estimate.get("auto"):
        auto = estimate["auto"]
        parts.append(Text(f"strategy auto chose {auto['choice']}: {auto['reason']}"))
    parts += [Text(line) for line in derivation_lines(estimate.get("plan") or {})]
    return Group(*parts)


def estimate_json(estimate: Mapping[str, Any]) -> str:
    """``estimate`` as indented, key-sorted JSON text."""
    return json.dumps(estimate, indent=2, sort_keys=True)
