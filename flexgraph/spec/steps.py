"""A step written as data turned into a :class:`Step`; functions stay ``"module:attr"`` text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph
from flexgraph.core.step import Step, StepDefinitionError
from flexgraph.spec.checks import Where, check_keys, mapping, names, plain, sequence, text
from flexgraph.spec.errors import SpecTypeError, SpecValueError, restate

STEP_FIELDS = ("name", "fn", "requires", "provides", "updates", "after", "before", "params", "doc",
               "needs", "gives", "ends")
"""The keys a step mapping may have; ``name`` and ``fn`` are required."""

NAME_FIELDS = ("requires", "provides", "updates", "after", "before", "needs", "gives", "ends")
"""The step fields that hold a name or a list of names."""


def _fn(value: object, where: Where) -> Callable[..., Any] | str:
    if callable(value):
        return value
    ref = text(value, where, "fn")
    module, sep, attr = ref.partition(":")
    if not sep:
        module, _, attr = ref.rpartition(".")
    dotted = module.split(".") + attr.split(".")
    if not module or not attr or not all(part.isidentifier() for part in dotted):
        raise SpecValueError(
            f"{where}: field 'fn' is {ref!r}; expected 'module:function' "
            "(e.g. 'textstats:tokenize')"
        )
    return ref


def step_from_mapping(data: object, where: Where, default_name: str | None = None) -> Step:
    """Build a :class:`Step` from a mapping; ``default_name`` makes ``name`` optional."""
    data = mapping(data, where)
    name = data.get("name", default_name)
    if isinstance(name, str):  # steps[2] (tokenize), or: ... (insert) step 'x'
        where = where.at(f"({name})") if where.path.endswith("]") else where.at(f"step {name!r}")
    required = ("fn",) if default_name is not None else ("name", "fn")
    check_keys(data, where, STEP_FIELDS, required)
    if not isinstance(name, str):
        raise SpecTypeError(f"{where}: field 'name' must be a string, not {name!r}")
    fields: dict[str, Any] = {
        field: names(data.get(field), where, field)
        for field in NAME_FIELDS
    }
    fields["fn"] = _fn(data["fn"], where)
    fields["params"] = plain(mapping(data.get("params") or {}, where, "params"))
    fields["doc"] = text(data.get("doc", ""), where, "doc")
    try:
        return Step(name=name, **fields)
    except StepDefinitionError as exc:
        raise restate(exc, str(where)) from exc


def steps_from_list(value: object, where: Where, field: str, user: str = "") -> list[Step]:
    """Build the steps of a ``steps:`` (or ``custom_steps``) list; ``user`` marks them."""
    items = sequence(value, where, field)
    steps = [step_from_mapping(item, where.at(f"{field}[{i}]")) for i, item in enumerate(items)]
    return [s.evolve(user=user) for s in steps] if user else steps


def graph_of(steps: Sequence[Step], inputs: Sequence[str], where: Where) -> Graph:
    """``Graph.of(steps, inputs)``, with an engine refusal restated at ``where``."""
    try:
        return Graph.of(steps, inputs=inputs)
    except FlexgraphError as exc:
        raise restate(exc, str(where)) from exc
