"""Strategies: a named, ordered list of rewrites, and the registry that finds them.

A strategy never branches inside another strategy's code and no step asks which
strategy is active: the whole difference between, say, single-device and DDP
training is the list of rewrites here (plus the functions of the steps those
rewrites bring in).

Strategies are found by name through a registry. Built-in and third-party
strategies register as entry points in the group ``flexgraph.strategies``; each
entry point is a factory ``factory(**options) -> Strategy``. Python code can
also :func:`register_strategy` a factory, and specs can define strategies as
data. The core knows no strategy by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

import attrs

from flexgraph.core.checks import Check
from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.rewrite import Rewrite

ENTRY_POINT_GROUP = "flexgraph.strategies"


class UnknownStrategyError(FlexgraphError, LookupError):
    """No strategy of that name is registered; the message lists the known ones.

    Raised by :func:`get_strategy`, with a did-you-mean for a close name.
    """


class StrategyOptionError(FlexgraphError, ValueError):
    """A strategy was given an option it does not take.

    Raised by :func:`get_strategy` before the factory runs (the options are
    checked against its signature), for a ``dict`` without ``type``, and for
    options given to a strategy a spec defines as data.
    """


@attrs.frozen
class Strategy:
    """A named, ordered list of rewrites.

    Parameters
    ----------
    name : str
        The name plans attribute rewrites to.
    rewrites : tuple of Rewrite
        Applied in order; each is validated before the next.
    doc : str
        One line on what the strategy is for.
    world_size : str
        ``"one"`` for strategies that run in a single process, ``"many"`` for
        ones that expect a process group (the CLI uses it to pick a default).
    checks : tuple of Check
        Orders and choices the rewrites establish for a reason
        (:mod:`flexgraph.core.checks`); the plan is refused, with the reason,
        when the final graph breaks one, even through rewrites appended later.
    run_imports : tuple of str
        Modules its step functions import when they run, never when planning
        (its library, e.g. ``deepspeed``): a launcher that forks its ranks from
        one process imports them there once, for every rank.
    memory_model : str or None
        The module of its memory model (``flexgraph plan --estimate``): what it
        keeps per rank, as ``estimate_memory(...)`` there says (see
        ``flexgraph.training.estimate``). Named, not imported, so planning
        stays free of torch.
    memory_options : mapping
        Keyword arguments the factory binds for ``estimate_memory`` (its
        stage, precision, bucket sizes).

    Raises
    ------
    ValueError
        ``world_size`` is neither ``"one"`` nor ``"many"``.

    Examples
    --------
    >>> from flexgraph import Configure
    >>> on_gpu = Strategy("on_gpu", [Configure("setup_env", {"device": "cuda"})])
    >>> [str(r) for r in on_gpu.then(Configure("build_model", {"device": "meta"})).rewrites]
    ["configure setup_env: device='cuda'", "configure build_model: device='meta'"]
    """

    name: str
    rewrites: tuple[Rewrite, ...] = attrs.field(default=(), converter=tuple)
    doc: str = ""
    world_size: str = attrs.field(default="one", validator=attrs.validators.in_(("one", "many")))
    checks: tuple[Check, ...] = attrs.field(default=(), converter=tuple)
    run_imports: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    memory_model: str | None = None
    memory_options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)

    def then(self, *rewrites: Rewrite) -> Strategy:
        """Return this strategy with ``rewrites`` appended (its checks still apply).

        Parameters
        ----------
        *rewrites : Rewrite

        Returns
        -------
        Strategy
            Same name, doc, world size and checks.
        """
        return attrs.evolve(self, rewrites=self.rewrites + rewrites)


StrategyFactory = Callable[..., Strategy]
_registered: dict[str, StrategyFactory] = {}


def register_strategy(name: str, factory: StrategyFactory, *aliases: str) -> None:
    """Make ``factory`` findable as ``name`` (and ``aliases``) in this process.

    Entry points of the group ``flexgraph.strategies`` register strategies for
    every process; this is for code that defines one at run time (a test, a
    script). A registered name shadows an entry point of the same name.

    Parameters
    ----------
    name : str
        The name :func:`get_strategy`, ``--strategy`` and a config's
        ``strategy=dict(type=...)`` use.
    factory : callable
        ``factory(**options) -> Strategy``; its signature says which options
        the strategy takes.
    *aliases : str
        More names for the same factory (``"DDPStrategy"`` beside ``"ddp"``).
    """
    for key in (name, *aliases):
        _registered[key] = factory


def _is_entry_point(found: Any) -> bool:
    """Whether ``found`` is an entry point not loaded yet, of either metadata library.

    Not an ``isinstance`` check against ``importlib.metadata.EntryPoint``: once
    the ``importlib_metadata`` backport is imported (mmpretrain does, and so does
    any config that lists it in ``custom_imports``), it installs its own finder,
    and the standard library's ``entry_points()`` hands back the backport's class.
    """
    return hasattr(found, "load") and isinstance(getattr(found, "value", None), str)


def known_strategies() -> dict[str, Any]:
    """Name -> factory or entry point, for every strategy that can be found.

    Returns
    -------
    dict
        The ``flexgraph.strategies`` entry points by name, and the strategies
        registered with :func:`register_strategy` (which win over an entry point
        of the same name).
    """
    found: dict[str, Any] = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    found.update(_registered)
    return found


def get_strategy(
    name: str | Strategy | Mapping[str, Any],
    extra: Mapping[str, Strategy] | None = None,
    **options: Any,
) -> Strategy:
    """Find a strategy by name (or ``dict(type=name, **options)``) and build it.

    Parameters
    ----------
    name : str, Strategy or mapping
        A registered name or entry-point name; a mapping with ``type`` (the
        name) and options, as an MMEngine config's ``strategy`` holds it; or a
        :class:`Strategy`, returned as it is.
    extra : mapping of str to Strategy, optional
        Strategies defined as data (a spec's ``strategies:``); they shadow
        registered ones of the same name and take no options.
    **options
        Keyword arguments for the factory, over those of a mapping ``name``.

    Returns
    -------
    Strategy

    Raises
    ------
    UnknownStrategyError
        The name is not known; the message lists the known names.
    StrategyOptionError
        The factory does not take one of the options, a mapping has no
        ``type``, or a strategy from ``extra`` was given options.

    Examples
    --------
    >>> get_strategy("single").world_size
    'one'
    >>> get_strategy({"type": "DDPStrategy"}).name
    'ddp'
    """
    if isinstance(name, Strategy):
        return name
    if isinstance(name, Mapping):
        options = {**{k: v for k, v in name.items() if k != "type"}, **options}
        if "type" not in name:
            raise StrategyOptionError(f"strategy {dict(name)!r} has no 'type'")
        name = name["type"]
    extra = extra or {}
    if name in extra:
        if options:
            raise StrategyOptionError(
                f"strategy {name!r} is defined in the spec and takes no options "
                f"(got {', '.join(sorted(options))})"
            )
        return extra[name]
    known = known_strategies()
    if name not in known:
        names = sorted(set(known) | set(extra))
        raise UnknownStrategyError(
            f"unknown strategy {name!r}{did_you_mean(name, names)}; known: {', '.join(names)}"
        )
    factory = known[name]
    if _is_entry_point(factory):
        factory = factory.load()
    try:
        inspect.signature(factory).bind(**options)
    except TypeError as exc:
        raise StrategyOptionError(f"strategy {name!r}: {exc}") from None
    return factory(**options)


def same_strategy(first: str, second: str) -> bool:
    """Whether two registered names are aliases of one factory (``fsdp``, ``FSDPStrategy``).

    Parameters
    ----------
    first, second : str
        Two strategy names.

    Returns
    -------
    bool
        ``True`` when both name the same factory (or are the same unknown name).
    """
    known = known_strategies()
    if first not in known or second not in known:
        return first == second

    def ref(factory: Any) -> str:
        if _is_entry_point(factory):
            return factory.value
        return f"{factory.__module__}:{factory.__qualname__}"

    return ref(known[first]) == ref(known[second])


def strategy_names(extra: Iterable[str] = ()) -> list[str]:
    """Sorted names of every findable strategy, plus ``extra``.

    Parameters
    ----------
    extra : iterable of str, default ()
        Names to add (a spec's own strategies).

    Returns
    -------
    list of str
        Sorted, without duplicates.
    """
    return sorted(set(known_strategies()) | set(extra))
