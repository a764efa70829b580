"""Every failure flexgraph reports, one class per kind.

All of them derive from :class:`FlexgraphError`, and each also derives from the
builtin that fits (``ValueError`` for bad input, ``KeyError``-like lookups stay
``LookupError``), so callers can catch either. Messages name the culprit and,
where a name was looked up, suggest close matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FlexgraphError(Exception):
    """Base class of every error flexgraph raises on purpose."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest known names, or ``''``."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
