"""A step written as data (a YAML mapping, a cfg.py dict) turned into a :class:`Step`.

One function for every front end, so the step fields are read and refused the
same way everywhere. Functions stay ``"module:attr"`` text, checked only for
their shape: planning never imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.graph import Graph
from flexgraph.core.step import Step, StepDefinitionError
from flexgraph.spec.checks import Where, check_keys, mapping, names, plain, sequence, text
from flexgraph.spec.errors import SpecTypeError, SpecValueError, restate

STEP_FIELDS = ("name", "fn", "requires", "provides", "updates", "after", "before", "params", "doc")
"""The keys a step mapping may have; ``name`` and ``fn`` are required."""


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
    """Build a :class:`Step` from a mapping with the :data:`STEP_FIELDS`.

    ``default_name`` makes ``name`` optional (a Replace keeps the old name).
    """
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
        for field in ("requires", "provides", "updates", "after", "before")
    }
    fields["fn"] = _fn(data["fn"], where)
    fields["params"] = plain(mapping(data.get("params") or {}, where, "params"))
    fields["doc"] = text(data.get("doc", ""), where, "doc")
    try:
        return Step(name=name, **fields)
    except StepDefinitionError as exc:
        raise restate(exc, str(where)) from exc


def steps_from_list(value: object, where: Where, field: str) -> list[Step]:
    """Build the steps of a ``steps:`` (or ``custom_steps``) list, each at ``field[i]``."""
    items = sequence(value, where, field)
    return [step_from_mapping(item, where.at(f"{field}[{i}]")) for i, item in enumerate(items)]


def graph_of(steps: Sequence[Step], inputs: Sequence[str], where: Where) -> Graph:
    """``Graph.of(steps, inputs)``, with an engine refusal restated at ``where``."""
    try:
        return Graph.of(steps, inputs=inputs)
    except FlexgraphError as exc:
        raise restate(exc, str(where)) from exc
