"""Rewrites and strategies written as data, turned into engine objects.

The forms, one key naming the kind (see :data:`REWRITE_KINDS`)::

    {insert: {step fields}, after: X}      # or before: X
    {remove: X}
    {replace: X, with: {step fields}}      # the new step's name defaults to X
    {move: X, after: Y}                    # or before: Y
    {fuse: [A, B], into: NAME}             # or into: {step fields}
    {configure: X, params: {...}}          # gives: [...], ends: [...]: facts it changes
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.rewrite import REWRITE_KINDS, Rewrite
from flexgraph.core.strategy import Strategy
from flexgraph.spec.checks import (
    Where,
    check_keys,
    mapping,
    names,
    plain,
    sequence,
    text,
    type_name,
)
from flexgraph.spec.errors import (
    SpecError,
    SpecFieldError,
    SpecTypeError,
    SpecValueError,
    restate,
)
from flexgraph.spec.steps import step_from_mapping

REWRITE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "insert": ("after", "before", "why"),
    "remove": ("why",),
    "replace": ("with", "why"),
    "move": ("after", "before", "why"),
    "fuse": ("into", "why"),
    "configure": ("params", "gives", "ends", "why"),
}
"""Besides its kind, the keys each rewrite takes."""

OPTIONAL = ("after", "before", "why", "gives", "ends")
"""The keys a rewrite may leave out."""

STRATEGY_FIELDS = ("rewrites", "doc", "world_size")


def _name(data: Mapping[str, Any], key: str, where: Where) -> str | None:
    value = data.get(key)
    return None if value is None else text(value, where, key)


def _build(kind: str, data: Mapping[str, Any], where: Where) -> Rewrite:
    cls = REWRITE_KINDS[kind]
    anchor = {"after": _name(data, "after", where), "before": _name(data, "before", where)}
    why = text(data.get("why", ""), where, "why")
    if kind == "insert":
        return cls(step_from_mapping(data[kind], where), **anchor, why=why)
    if kind == "move":
        return cls(text(data[kind], where, kind), **anchor, why=why)
    if kind == "remove":
        return cls(text(data[kind], where, kind), why=why)
    if kind == "replace":
        old = text(data[kind], where, kind)
        return cls(old, step_from_mapping(data["with"], where, default_name=old), why=why)
    if kind == "fuse":
        members = names(sequence(data[kind], where, kind), where, kind)
        into = data["into"]
        fused = into if isinstance(into, str) else step_from_mapping(into, where)
        return cls(members, fused, why=why)
    facts = {field: names(data.get(field), where, field) for field in ("gives", "ends")}
    return cls(text(data[kind], where, kind), plain(mapping(data["params"], where, "params")),
               **facts, why=why)


def rewrite_from_mapping(data: object, where: Where) -> Rewrite:
    """Build one :class:`Rewrite` from its mapping form (see the module docstring)."""
    data = mapping(data, where)
    kinds = [key for key in data if key in REWRITE_KINDS]
    if not kinds:
        keys = [str(k) for k in data]
        hint = next((h for h in (did_you_mean(k, REWRITE_KINDS) for k in keys) if h), "")
        raise SpecFieldError(
            f"{where}: a rewrite needs one of {', '.join(REWRITE_KINDS)}; "
            f"got {', '.join(map(repr, keys)) or 'nothing'}{hint}"
        )
    if len(kinds) > 1:
        raise SpecFieldError(
            f"{where}: one rewrite cannot be both {kinds[0]!r} and {kinds[1]!r}; "
            "write them as two items"
        )
    kind = kinds[0]
    where = where.at(f"({kind})")
    required = [k for k in REWRITE_FIELDS[kind] if k not in OPTIONAL]
    check_keys(data, where, (kind, *REWRITE_FIELDS[kind]), (kind, *required))
    try:
        return _build(kind, data, where)
    except SpecError:
        raise
    except FlexgraphError as exc:
        raise restate(exc, str(where)) from exc


def strategy_from_data(name: str, value: object, where: Where) -> Strategy:
    """Build the strategy ``name`` from a list of rewrites or a ``{rewrites: ...}`` mapping."""
    where = where.at(name)
    fields: dict[str, Any] = {}
    if isinstance(value, Mapping):
        check_keys(value, where, STRATEGY_FIELDS, ("rewrites",))
        fields["doc"] = text(value.get("doc", ""), where, "doc")
        if "world_size" in value:
            fields["world_size"] = text(value["world_size"], where, "world_size")
            if fields["world_size"] not in ("one", "many"):
                raise SpecValueError(f"{where}: field 'world_size' must be 'one' or 'many'")
        value = value["rewrites"]
    elif not isinstance(value, (list, tuple)):
        raise SpecTypeError(
            f"{where}: a strategy is a list of rewrites or a mapping with 'rewrites', "
            f"not {type_name(value)}"
        )
    items = sequence(value, where, "rewrites")
    rewrites = [rewrite_from_mapping(item, where.at(f"[{i}]")) for i, item in enumerate(items)]
    return Strategy(name, rewrites, **fields)


def strategies_from_data(value: object, where: Where) -> dict[str, Strategy]:
    """Build every strategy of a ``strategies:`` mapping, keyed by name."""
    where = where.at("strategies")
    found = {}
    for name, body in mapping(value, Where(where.file), "strategies").items():
        if not isinstance(name, str) or not name:
            raise SpecTypeError(f"{where}: strategy names must be strings, not {name!r}")
        found[name] = strategy_from_data(name, body, where)
    return found
