"""Small checks shared by the front ends, each failing with the file and place named.

A spec is untrusted data: every mapping is checked for unknown and missing
keys and every field for its type before any engine object is built.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from flexgraph.core.errors import did_you_mean
from flexgraph.spec.errors import SpecFieldError, SpecMissingFieldError, SpecTypeError


@attrs.frozen
class Where:
    """A place in a spec file: the file and a path such as ``steps[2] (tokenize)``."""

    file: str
    path: str = ""

    def at(self, part: str) -> Where:
        """The place ``part`` below this one (``[3]``, ``(move)`` or a key)."""
        if not self.path:
            return Where(self.file, part)
        sep = "" if part.startswith("[") else " " if part.startswith(("(", "step ")) else "."
        return Where(self.file, self.path + sep + part)

    def __str__(self) -> str:
        return f"{self.file}: {self.path}" if self.path else self.file


def type_name(value: object) -> str:
    """``'a list'``, ``'an int'``...: how messages name the type of a bad value."""
    name = {dict: "mapping", list: "list", tuple: "list", str: "string"}.get(
        type(value), type(value).__name__
    )
    if value is None:
        return "nothing (null)"
    return ("an " if name[0] in "aeiou" else "a ") + name


def check_keys(
    data: Mapping[str, Any],
    where: Where,
    allowed: Collection[str],
    required: Collection[str] = (),
    what: str = "field",
) -> None:
    """Refuse keys outside ``allowed`` (with a did-you-mean) and absent ``required`` ones."""
    for key in data:
        if not isinstance(key, str):
            raise SpecTypeError(f"{where}: {what} names must be strings, not {type_name(key)}")
        if key not in allowed:
            raise SpecFieldError(
                f"{where}: unknown {what} {key!r}{did_you_mean(key, allowed)}; "
                f"expected: {', '.join(allowed)}"
            )
    for key in required:
        if key not in data:
            raise SpecMissingFieldError(f"{where}: missing {what} {key!r}")


def mapping(value: object, where: Where, field: str | None = None) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else a :class:`SpecTypeError`."""
    if isinstance(value, Mapping):
        return value
    if field:
        raise SpecTypeError(f"{where}: field {field!r} must be a mapping, not {type_name(value)}")
    raise SpecTypeError(f"{where}: expected a mapping, got {type_name(value)} ({value!r:.40})")


def sequence(value: object, where: Where, field: str) -> Sequence[Any]:
    """``value`` if it is a list (or tuple), else a :class:`SpecTypeError`."""
    if isinstance(value, (list, tuple)):
        return value
    raise SpecTypeError(f"{where}: field {field!r} must be a list, not {type_name(value)}")


def text(value: object, where: Where, field: str) -> str:
    """``value`` if it is a string, else a :class:`SpecTypeError`."""
    if isinstance(value, str):
        return value
    raise SpecTypeError(f"{where}: field {field!r} must be a string, not {type_name(value)}")


def names(value: object, where: Where, field: str) -> tuple[str, ...]:
    """A name or a list of names, as a tuple; anything else is a :class:`SpecTypeError`."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    bad = value
    if isinstance(value, (list, tuple)):
        wrong = [v for v in value if not isinstance(v, str)]
        if not wrong:
            return tuple(value)
        bad = wrong[0]
    raise SpecTypeError(
        f"{where}: field {field!r} must be a name or a list of names; "
        f"got {type_name(bad)} ({bad!r})"
    )


def plain(value: Any) -> Any:
    """Mapping and list subclasses (mmengine's ConfigDict) as dict and list."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return value
