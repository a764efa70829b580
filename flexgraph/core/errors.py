"""The root of flexgraph's exception tree, and the did-you-mean every lookup appends.

:class:`FlexgraphError` is the base class of every error flexgraph raises on
purpose; the classes themselves live beside the code that raises them (graph
errors in :mod:`flexgraph.core.graph`, step errors in :mod:`flexgraph.core.step`
and :mod:`flexgraph.core.references`, spec errors in :mod:`flexgraph.spec.errors`,
training errors in :mod:`flexgraph.training.errors`, ...). Each of them also
derives from the builtin that fits (``ValueError`` for bad input,
``LookupError`` for a name that is not found), so callers can catch either.
Messages name the culprit; where a name was looked up, :func:`did_you_mean`
suggests close matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FlexgraphError(Exception):
    """Base class of every error flexgraph raises on purpose.

    ``flexgraph plan`` and ``flexgraph run`` print such an error as one line
    and exit with status 2, bad input (a :class:`~flexgraph.StepFailedError`
    only when its cause is a FlexgraphError too; a step that raised anything
    else exits 1); ``--debug`` adds the traceback. Catch it to handle every
    anticipated failure at once; catch a subclass, or the builtin it also
    derives from, to handle one kind.

    Examples
    --------
    >>> from flexgraph import Graph, MissingInputError, Step
    >>> issubclass(MissingInputError, FlexgraphError)
    True
    >>> try:
    ...     Graph.of([Step("a", "m:f"), Step("a", "m:g")])
    ... except FlexgraphError as error:
    ...     print(error)
    two steps are named 'a'; step names must be unique
    """


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """The close matches of ``name`` among ``known``, as a clause to append to a message.

    Parameters
    ----------
    name : str
        The name that was looked up and not found.
    known : iterable of str
        The names that exist.

    Returns
    -------
    str
        `` (did you mean 'x'?)`` (up to three names, joined by ``or``), or
        ``''`` when none is close.

    Examples
    --------
    >>> did_you_mean("biuld_model", ["build_model", "init_weights"])
    " (did you mean 'build_model'?)"
    >>> did_you_mean("xyz", ["build_model"])
    ''
    """
    close = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
