"""Where text views go: a rich console, plain and of fixed width off a TTY, so the
same plan gives the same bytes.
"""

from __future__ import annotations

import io
import sys
from typing import IO

from rich.console import Console, RenderableType

PLAIN_WIDTH = 120
"""Console width when stdout is not a terminal."""


def stdout_console(file: IO[str] | None = None) -> Console:
    """A rich Console on ``file`` (default stdout): the terminal's settings on a TTY, else plain."""
    file = file if file is not None else sys.stdout
    isatty = getattr(file, "isatty", None)
    if isatty is not None and isatty():
        return Console(file=file, highlight=False)
    return Console(
        file=file,
        width=PLAIN_WIDTH,
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        force_interactive=False,
        no_color=True,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )


def print_renderable(renderable: RenderableType, file: IO[str] | None = None) -> None:
    """Print a rich renderable to ``file`` (default stdout).

    Off a terminal: plain, no trailing padding, never cropped.
    """
    file = file if file is not None else sys.stdout
    console = stdout_console(file)
    if console.is_terminal:
        console.print(renderable, crop=False)
        return
    buffer = io.StringIO()
    stdout_console(buffer).print(renderable, crop=False)
    file.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))
