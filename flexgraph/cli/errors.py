"""How an error that ended a command is reported: an exit status and one line.

Bad input (any :class:`~flexgraph.core.errors.FlexgraphError`, also when a step
raised it) exits 2 with its message; anything else exits 1 with the exception's
type and message, and the hint that ``--debug`` shows the traceback. The
launcher reports the ranks' errors the same way, so it shares these.
"""

from __future__ import annotations

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.executor import StepFailedError

__all__ = ["DEBUG_HINT", "UsageError", "describe_error"]

DEBUG_HINT = "(run with --debug to see the traceback)"


class UsageError(FlexgraphError, ValueError):
    """Flags that argparse accepts one by one but not together (exit 2)."""


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def describe_error(exc: BaseException) -> tuple[int, str]:
    """The exit status and the one-line message for an error that ended a command.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    (int, str)
        ``(2, message)`` for bad input, ``(1, message)`` otherwise (see the
        module docstring); the message has no line breaks.
    """
    if isinstance(exc, StepFailedError):
        cause = exc.__cause__
        if isinstance(cause, FlexgraphError):
            return 2, _one_line(f"step {exc.step!r}: {cause}")
        return 1, _one_line(str(exc))
    if isinstance(exc, FlexgraphError):
        return 2, _one_line(str(exc)) or type(exc).__name__
    message = _one_line(str(exc))
    return 1, f"{type(exc).__name__}: {message}" if message else type(exc).__name__
