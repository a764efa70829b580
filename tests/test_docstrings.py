"""The faces strategies build on document their public callables in numpydoc sections.

Every function and class that one of the faces below lists (its ``__all__``, or
the public names a module defines) has a ``Parameters`` section naming each
parameter it takes (a class: its constructor's), names no parameter it does not
take, and a ``Returns`` (or, for a generator, ``Yields``) section when it
returns a value. Those are the packages a strategy imports (``grep '^from
flexgraph' strategies/``) and the strategies' own faces: the API a new strategy
is written against, whose reference page (docs/api/) is generated from these
docstrings. ``Raises`` sections cannot be checked this way; they are written
by hand where a function raises.
"""

from __future__ import annotations

import importlib
import inspect
import re
import typing

import pytest

FACES = (
    "flexgraph.core.checks",
    "flexgraph.core.errors",
    "flexgraph.core.rewrite",
    "flexgraph.core.step",
    "flexgraph.core.strategy",
    "flexgraph.training.checkpoint",
    "flexgraph.training.checkpoint_tools",
    "flexgraph.training.components",
    "flexgraph.training.config",
    "flexgraph.training.errors",
    "flexgraph.training.estimate",
    "flexgraph.training.formats",
    "flexgraph.training.output",
    "flexgraph.training.runtime",
    "flexgraph.strategies.common",
    "flexgraph.strategies.ddp",
    "flexgraph.strategies.deepspeed",
    "flexgraph.strategies.fsdp",
    "flexgraph.strategies.names",
    "flexgraph.strategies.single_device",
)
SECTION = re.compile(r"^(?P<name>[A-Z][A-Za-z ]+)\n-{3,}$", re.M)
PARAMETER_SECTIONS = ("Parameters", "Other Parameters", "Attributes")


def sections(doc: str) -> dict[str, str]:
    """A numpydoc docstring's sections by title (the text under each underline)."""
    found = list(SECTION.finditer(doc))
    ends = [m.start() for m in found] + [len(doc)]
    return {m["name"]: doc[m.end():end] for m, end in zip(found, ends[1:], strict=False)}


def documented(section: str) -> set[str]:
    """The names a Parameters-like section documents (``a, b : int`` documents two)."""
    names = set()
    for line in section.splitlines():
        if line.strip() and not line.startswith(" "):
            entry = line.split(" : ", 1)[0]
            names.update(name.strip().lstrip("*") for name in entry.split(","))
    return names


def public_callables(face: str) -> list[tuple[str, object]]:
    module = importlib.import_module(face)
    names = getattr(module, "__all__", None) or [
        name for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == face]
    found = []
    for name in names:
        value = getattr(module, name)
        if not (inspect.isfunction(value) or inspect.isclass(value)):
            continue  # constants: documented by the comment or docstring beside them
        if inspect.isclass(value) and issubclass(value, BaseException):
            continue  # an error's constructor takes the message
        if not getattr(value, "__module__", "").startswith("flexgraph"):
            continue  # MMEngine's or torch's, re-exported
        found.append((f"{face}.{name}", value))
    return found


def _returns_something(function: typing.Callable) -> bool:
    annotation = inspect.signature(function).return_annotation
    if annotation in (inspect.Signature.empty, None, "None"):
        return False
    # a @contextmanager's generator: what it yields is None, the value is the manager
    return not re.fullmatch(r"(Iterator|Generator)\[None.*\]", str(annotation))


def problems(name: str, value: object) -> list[str]:
    text = sections(inspect.cleandoc(value.__doc__ or ""))
    names = set().union(*(documented(text.get(s, "")) for s in PARAMETER_SECTIONS))
    if inspect.isclass(value):
        if "__init__" not in vars(value) and not hasattr(value, "__attrs_attrs__"):
            return []
        takes = list(inspect.signature(value).parameters)
        unknown = []  # Attributes may name what no constructor takes
    else:
        takes = list(inspect.signature(value).parameters)
        unknown = sorted(names - set(takes))
    missing = [p for p in takes if p not in names]
    found = []
    if missing:
        found.append(f"{name}: Parameters lacks {missing}")
    if unknown:
        found.append(f"{name}: Parameters names {unknown}, which it does not take")
    if inspect.isfunction(value) and _returns_something(value):
        wanted = "Yields" if inspect.isgeneratorfunction(value) else "Returns"
        if wanted not in text:
            found.append(f"{name}: no {wanted} section")
    return found


@pytest.mark.parametrize("face", FACES)
def test_public_callables_document_parameters_and_returns(face: str) -> None:
    callables = public_callables(face)
    assert callables or face.endswith("errors"), f"{face} lists no callable"
    assert [p for name, value in callables for p in problems(name, value)] == []


def test_the_check_finds_what_is_missing() -> None:
    def documented_well(path: str, *, strict: bool = False) -> int:
        """Example.

        Parameters
        ----------
        path : str
            A path.
        strict : bool, default False
            Strictly.

        Returns
        -------
        int
            A number.
        """
        return 0

    def documented_badly(path: str, mode: str) -> int:
        """Example.

        Parameters
        ----------
        path:
            A path, with the colon numpydoc does not read as a separator.
        mood : str
            Misspelled.
        """
        return 0

    assert problems("well", documented_well) == []
    assert problems("badly", documented_badly) == [
        "badly: Parameters lacks ['path', 'mode']",
        "badly: Parameters names ['mood', 'path:'], which it does not take",
        "badly: no Returns section",
    ]
