"""The progress bar on a terminal: one line, redrawn by the loop's ticks, log lines above it.

A single ``Text`` line in rich's ``Live`` display (rich's ``Progress`` renders a
table at every redraw). Log lines are printed unwrapped, as in the log file.
"""

from __future__ import annotations

import math
from typing import Any

_BAR_WIDTH = 40  # columns, as rich's default bar


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` for elapsed times and ETAs (``?`` when not known yet)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class TerminalBar:
    """``description ━━━━━━━━╺━━━━━ done/total elapsed eta remaining status``, live."""

    def __init__(self, description: str, total: int) -> None:
        from rich.live import Live
        from rich.text import Text

        self._text = Text
        self._description = description
        self._total = max(total, 1)
        self._live: Any = Live(Text(""), auto_refresh=False, transient=False)
        #: what the line said last: (done, elapsed, remaining, status)
        self.shown: tuple[int, float, float, str] | None = None

    def start(self) -> None:
        self._live.start()

    def show(self, done: int, *, elapsed: float, remaining: float, status: str = "",
             lines: str = "") -> None:
        """Redraw the line; ``lines`` (if any) are printed above it first, in one write."""
        self.shown = (done, elapsed, remaining, status)
        filled = min(_BAR_WIDTH, _BAR_WIDTH * done // self._total)
        full = done >= self._total
        line = self._text.assemble(
            (self._description, "bold"), " ",
            ("━" * filled, "bar.finished" if full else "bar.complete"),
            ("━" * (_BAR_WIDTH - filled), "bar.back"),
            f" {done}/{self._total} {format_duration(elapsed)} eta "
            f"{format_duration(remaining)} {status}",
            no_wrap=True, overflow="crop")
        self._live.update(line, refresh=not lines)
        if lines:  # soft_wrap: the terminal wraps them (see the module's docstring)
            self._live.console.print(lines, highlight=False, markup=False, soft_wrap=True)

    def stop(self) -> None:
        """Leave the last line on the screen; later output goes below it."""
        self._live.stop()
