"""How an error that ended a command is reported: an exit status and one line."""

from __future__ import annotations

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.executor import ContractError, StepFailedError

DEBUG_HINT = "(run with --debug to see the traceback)"


class UsageError(FlexgraphError, ValueError):
    """Flags that argparse accepts one by one but not together (exit 2)."""


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def describe_error(exc: BaseException) -> tuple[int, str]:
    """``(2, message)`` for bad input, ``(1, message)`` otherwise; the message is one line."""
    if isinstance(exc, StepFailedError):
        cause = exc.__cause__
        if isinstance(cause, ContractError):  # found during training: it names its step
            return 2, _one_line(str(cause))
        if isinstance(cause, FlexgraphError):
            return 2, _one_line(f"step {exc.step!r}: {cause}")
        return 1, _one_line(str(exc))
    if isinstance(exc, FlexgraphError):
        return 2, _one_line(str(exc)) or type(exc).__name__
    message = _one_line(str(exc))
    return 1, f"{type(exc).__name__}: {message}" if message else type(exc).__name__
