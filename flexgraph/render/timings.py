"""What a run cost, step by step: the table ``flexgraph run`` prints at the end."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from flexgraph.core.executor import StepRecord
from flexgraph.render._table_style import TABLE_STYLE

STATUS_STYLES = {"ok": "green", "failed": "bold red", "planned": "dim"}


def _mib(value: float | None) -> Text:
    return Text("-" if value is None else f"{value:.1f}")


def timings_table(records: Sequence[StepRecord], title: str = "step timings") -> Table:
    """The records as a table, with a total row (seconds summed, steps ok, highest peak)."""
    table = Table(title=title, **TABLE_STYLE)
    table.add_column("step", no_wrap=True)
    table.add_column("origin", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("seconds", justify="right", no_wrap=True)
    table.add_column("rss MiB", justify="right", no_wrap=True)
    table.add_column("peak RSS MiB", justify="right", no_wrap=True)
    for record in records:
        table.add_row(
            Text(record.name),
            Text(record.origin, style="dim" if record.origin == "base" else ""),
            Text(record.status, style=STATUS_STYLES.get(record.status, "")),
            Text(f"{record.seconds:.3f}"),
            _mib(record.rss_mib),
            _mib(record.peak_rss_mib),
        )
    peaks = [r.peak_rss_mib for r in records if r.peak_rss_mib is not None]
    ok = sum(1 for r in records if r.status == "ok")
    table.add_section()
    table.add_row(
        Text("total", style="bold"),
        Text(""),
        Text(f"{ok}/{len(records)} ok"),
        Text(f"{sum(r.seconds for r in records):.3f}", style="bold"),
        Text(""),
        _mib(max(peaks) if peaks else None),
    )
    return table
