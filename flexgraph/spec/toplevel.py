"""The top-level fields that YAML specs and cfg.py configs share, read in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph
from flexgraph.spec.checks import Where, mapping, plain
from flexgraph.spec.errors import SpecTypeError, restate
from flexgraph.spec.model import Spec, StrategyChoice
from flexgraph.spec.rewrites import strategies_from_data
from flexgraph.spec.steps import steps_from_list


def strategy_choice(value: object, where: Where) -> StrategyChoice:
    """Check a ``strategy`` value: a name, ``{type: name, **options}`` or nothing."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        choice = plain(value)
        if not isinstance(choice.get("type"), str):
            raise SpecTypeError(f"{where}: field 'strategy' as a mapping needs type='<name>'")
        return choice
    raise SpecTypeError(
        f"{where}: field 'strategy' must be a name or dict(type=...), not {value!r}"
    )


def inputs_from_data(value: object, where: Where) -> dict[str, Any]:
    """Check an ``inputs`` mapping (artifact name -> initial value)."""
    if value is None:
        return {}
    inputs = mapping(value, where, "inputs")
    for key in inputs:
        if not isinstance(key, str) or not key:
            raise SpecTypeError(f"{where}: field 'inputs' has a non-name key {key!r}")
    return plain(inputs)


def extend_graph(graph: Graph, value: object, where: Where, field: str) -> Graph:
    """``graph.extend(steps)`` for the user's step list ``value``; refusals name ``field``."""
    extra = steps_from_list(value, where, field, user=field)
    try:
        return graph.extend(extra)
    except FlexgraphError as exc:
        raise restate(exc, f"{where}: {field}") from exc


def apply_options(inputs: Mapping[str, Any], options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``inputs`` with ``--cfg-options`` applied; they add no graph input a step could depend on."""
    result = dict(inputs)
    for key, value in (options or {}).items():
        *parents, last = key.split(".")
        target = result
        for part in parents:
            inner = target.get(part)
            target[part] = dict(inner) if isinstance(inner, Mapping) else {}
            target = target[part]
        target[last] = value
    return result


def build_spec(
    data: Mapping[str, Any], graph: Graph, where: Where, inputs: Mapping[str, Any], **extra: Any
) -> Spec:
    """The :class:`Spec` of ``graph`` with ``data``'s strategies and strategy choice."""
    return Spec(
        graph=graph,
        strategies=strategies_from_data(data.get("strategies", {}) or {}, where),
        strategy=strategy_choice(data.get("strategy"), where),
        inputs=inputs,
        source=where.file,
        **extra,
    )
