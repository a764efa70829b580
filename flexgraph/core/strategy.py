"""Strategies: a named, ordered list of rewrites, and the registry that finds them.

No step asks which strategy is active; the core knows no strategy by name.
Strategies are entry points of the group ``flexgraph.strategies`` or factories
given to :func:`register_strategy`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

import attrs

from flexgraph.core.checks import Check
from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.rewrite import Rewrite

ENTRY_POINT_GROUP = "flexgraph.strategies"


class UnknownStrategyError(FlexgraphError, LookupError):
    """No strategy of that name is registered; the message lists the known ones."""


class StrategyOptionError(FlexgraphError, ValueError):
    """A strategy was given an option it does not take (checked before its factory runs)."""


@attrs.frozen
class Strategy:
    """A named, ordered list of rewrites.

    Parameters
    ----------
    name : str
    rewrites : tuple of Rewrite
    doc : str
        One line on what the strategy is for.
    world_size : str
        ``"one"`` (one process) or ``"many"`` (expects a process group).
    checks : tuple of Check
        Orders the plan must keep, even through rewrites appended later.
    memory_model, memory_options : str or None, mapping
        The module whose ``estimate_memory`` says what a rank keeps, and its options.
    prunable : tuple of str
        Steps a run may prune before these rewrites; the rewrites fit either graph.
    plan_notes : str or None
        ``'module:function'`` of ``(cfg, strategy) -> {step: line}`` for ``flexgraph plan``.
    """

    name: str
    rewrites: tuple[Rewrite, ...] = attrs.field(default=(), converter=tuple)
    doc: str = ""
    world_size: str = attrs.field(default="one", validator=attrs.validators.in_(("one", "many")))
    checks: tuple[Check, ...] = attrs.field(default=(), converter=tuple)
    memory_model: str | None = None
    memory_options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    prunable: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    plan_notes: str | None = None

    def then(self, *rewrites: Rewrite) -> Strategy:
        """This strategy with ``rewrites`` appended; its checks still apply."""
        return attrs.evolve(self, rewrites=self.rewrites + rewrites)


StrategyFactory = Callable[..., Strategy]
_registered: dict[str, StrategyFactory] = {}


def register_strategy(name: str, factory: StrategyFactory, *aliases: str) -> None:
    """Make ``factory`` findable as ``name`` and ``aliases`` in this process.

    Parameters
    ----------
    name : str
    factory : callable
        ``factory(**options) -> Strategy``; its signature gives the options.
    *aliases : str
    """
    for key in (name, *aliases):
        _registered[key] = factory


def _is_entry_point(found: Any) -> bool:
    """Whether ``found`` is an entry point not loaded yet.

    Not ``isinstance``: once mmpretrain imports the ``importlib_metadata``
    backport, ``entry_points()`` returns its class.
    """
    return hasattr(found, "load") and isinstance(getattr(found, "value", None), str)


def known_strategies() -> dict[str, Any]:
    """Name -> factory or entry point, for every strategy that can be found.

    Returns
    -------
    dict
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
        A :class:`Strategy` is returned as it is.
    extra : mapping of str to Strategy, optional
        Strategies defined as data (a spec's); they shadow others and take no options.
    **options

    Returns
    -------
    Strategy
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
    """Whether two names are aliases of one factory (``fsdp``, ``FSDPStrategy``).

    Parameters
    ----------
    first, second : str

    Returns
    -------
    bool
    """
    known = known_strategies()
    if first not in known or second not in known:
        return first == second

    def ref(factory: Any) -> str:
        if _is_entry_point(factory):
            return factory.value
        return f"{factory.__module__}:{factory.__qualname__}"

    return ref(known[first]) == ref(known[second])

