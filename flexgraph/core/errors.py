"""The root of flexgraph's exception tree, and the did-you-mean every lookup appends.

Each error also derives from the builtin that fits, so callers can catch either.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FlexgraphError(Exception):
    """Base class of every error flexgraph raises on purpose; the CLI exits 2 on one."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The close matches of ``name`` among ``known``, as a clause to append to a message.

    Parameters
    ----------
    name : str
    known : iterable of str

    Returns
    -------
    str
        `` (did you mean 'x'?)`` (up to three names), or ``''`` when none is close.
    """
    close = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
