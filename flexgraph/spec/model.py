"""The :class:`Spec`: what every front end (YAML, Python script, cfg.py) produces."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph
from flexgraph.core.plan import Plan, make_plan
from flexgraph.core.rewrite import Rewrite
from flexgraph.core.strategy import Strategy, get_strategy, same_strategy
from flexgraph.spec.errors import restate

StrategyChoice = str | Mapping[str, Any] | None


def _frozen(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Spec:
    """A pipeline as loaded from a file."""

    graph: Graph
    strategies: Mapping[str, Strategy] = attrs.field(factory=dict, converter=_frozen)
    strategy: StrategyChoice = None
    inputs: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen, eq=False)
    source: Path = attrs.field(default=Path("<python>"), converter=Path)
    cfg: Any = attrs.field(default=None, eq=False, repr=False)

    def resolve_strategy(self, strategy: StrategyChoice | Strategy = None) -> Strategy | None:
        """The strategy to plan with: ``strategy`` (the CLI's), else the spec's, or ``None``.

        The spec's own ``strategies`` come before the registry; a CLI name that names
        the spec's choice (an alias included) keeps the spec's options.
        """
        chosen = strategy if strategy is not None else self.strategy
        if chosen is None:
            return None
        if isinstance(strategy, str) and isinstance(self.strategy, Mapping) and (
            strategy not in self.strategies and same_strategy(strategy, self.strategy["type"])
        ):
            chosen = self.strategy  # --strategy fsdp on an FSDPStrategy config: its options
        try:
            return get_strategy(chosen, extra=self.strategies)
        except FlexgraphError as exc:
            if strategy is not None:
                raise
            raise restate(exc, f"{self.source}: field 'strategy'") from exc

    def plan(
        self, strategy: StrategyChoice | Strategy = None, targets: tuple[str, ...] = (),
        derived: Sequence[Rewrite] = (),
    ) -> Plan:
        """Plan the graph under :meth:`resolve_strategy`'s choice; errors name the file.

        Examples
        --------
        >>> from flexgraph import Graph, Step
        >>> Spec(Graph.of([Step("a", "m:f", provides="x")])).plan().order
        ('a',)
        """
        chosen = self.resolve_strategy(strategy)
        try:
            return make_plan(self.graph, chosen, targets=targets, derived=derived)
        except FlexgraphError as exc:
            raise restate(exc, str(self.source)) from exc
