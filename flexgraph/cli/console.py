"""Where text views go: a rich console that is plain whenever stdout is not a TTY.

``flexgraph plan`` output is read by people in a terminal and by scripts, CI
logs and tests through a pipe. In a terminal it gets colour and the terminal's
width; anywhere else it is plain (no colour or styles, width 120 whatever
``COLUMNS`` or ``FORCE_COLOR`` say, no trailing spaces), so the same plan gives
the same bytes every time and diffs cleanly.
"""

from __future__ import annotations

import io
import sys
from typing import IO

from rich.console import Console, RenderableType

PLAIN_WIDTH = 120
"""Console width when stdout is not a terminal."""


def stdout_console(file: IO[str] | None = None) -> Console:
    """A rich Console on ``file`` (default: the current ``sys.stdout``).

    Parameters
    ----------
    file : text stream, optional

    Returns
    -------
    rich.console.Console
        The terminal's own settings when ``file`` is a TTY; otherwise plain:
        no colour or styles, no highlighting, width 120, whatever the
        environment says.
    """
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
    """Print a rich renderable to ``file`` (default: the current ``sys.stdout``).

    On a terminal this is ``Console.print``. Otherwise the renderable is drawn
    on a plain console (see :func:`stdout_console`) and written with the
    padding rich adds at line ends removed. Lines are never cropped: a table
    that cannot fit without breaking a name is drawn wider, and wraps where
    it is shown.

    Parameters
    ----------
    renderable : rich renderable (a Table, a Group, Text, ...)
    file : text stream, optional
    """
    file = file if file is not None else sys.stdout
    console = stdout_console(file)
    if console.is_terminal:
        console.print(renderable, crop=False)
        return
    buffer = io.StringIO()
    stdout_console(buffer).print(renderable, crop=False)
    file.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))
