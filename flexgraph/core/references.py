"""Function references (``"module:attr"``): checked without importing, or resolved up front.

A step's function may be text, so that planning never imports the module it
lives in (importing runs arbitrary code, and the training steps import torch).
Two promises rest on this module:

- ``flexgraph plan`` checks references *without importing them*
  (:func:`check_references`). Each module is found the way the import system
  would find it, but one dotted part at a time: every finder on
  ``sys.meta_path`` is asked for ``a``, then for ``a.b`` with ``a``'s search
  locations, and so on, so no package's ``__init__`` runs
  (``importlib.util.find_spec`` would import the parents). The module's source
  is then read with :mod:`ast` for the names bound at its top level
  (:mod:`flexgraph.core.source_names`). What that cannot settle (a compiled
  module, a star import, a module ``__getattr__``) is returned as
  :class:`Unchecked`, with the reason; what is definitely wrong raises.
- ``flexgraph run`` imports every function of the plan before the first step
  runs (:func:`resolve_functions`), so a misspelling costs nothing: no step has
  run and nothing was written. Its launcher, which runs no step, imports only
  what the static check left open (:func:`resolve_unchecked`) before it starts
  any rank.

Every failure has its own class under :class:`StepFunctionError` (a
:class:`~flexgraph.core.errors.FlexgraphError` and an ``ImportError``), and
names the step, the reference and, for an unknown name, the close ones.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Iterable
from importlib.machinery import ModuleSpec
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.source_names import binds_dynamically, module_names


class StepFunctionError(FlexgraphError, ImportError):
    """A step's function reference cannot be resolved (base of the classes below).

    Raised by ``flexgraph plan``'s static check of the references and, before
    the first step runs, by :meth:`flexgraph.Executor.run`, so a misspelt
    reference fails with nothing run and nothing written. The subclass says
    which part is wrong: :class:`FunctionReferenceFormError`,
    :class:`UnknownModuleError`, :class:`ModuleImportError`,
    :class:`UnknownFunctionError` or :class:`NotCallableError`; the message
    starts with the step and suggests close names for an unknown one.
    """


class FunctionReferenceFormError(StepFunctionError):
    """The reference is not of the form ``'module:attr'``."""


class UnknownModuleError(StepFunctionError):
    """No module of the referenced name can be found (the message suggests close names)."""


class ModuleImportError(StepFunctionError):
    """The module exists, but importing it failed (its own import, its syntax, its code)."""


class UnknownFunctionError(StepFunctionError):
    """The module has no attribute of the referenced name (the message suggests close ones)."""


class NotCallableError(StepFunctionError):
    """The reference names something that cannot be called."""


@attrs.frozen
class Unchecked:
    """A reference that :func:`check_references` could not settle without importing."""

    where: str  # "step 'x'", or "step 'x' (fused into 'y')"
    ref: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: fn {self.ref!r} not checked: {self.reason}"


def split_ref(ref: str) -> tuple[str, str]:
    """``"pkg.mod:attr"`` (or ``"pkg.mod.attr"``) as ``("pkg.mod", "attr")``.

    Raises
    ------
    FunctionReferenceFormError
        Either half is missing.
    """
    module, sep, attr = ref.partition(":")
    if not sep:
        module, _, attr = ref.rpartition(".")
    if not module or not attr:
        raise FunctionReferenceFormError(f"fn {ref!r} is not of the form 'module:attr'")
    return module, attr


# -- finding modules without importing them ------------------------------------------


def _find_spec(name: str, path: list[str] | None) -> ModuleSpec | None:
    """Ask each meta-path finder for ``name`` under ``path``, as ``import`` would."""
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, path)
        except Exception:  # a third-party finder's bug must not fail a plan
            continue
        if spec is not None:
            return spec
    return None


def _submodules(path: list[str] | None) -> list[str]:
    """Names of the modules in ``path`` (top-level modules when ``None``); imports nothing."""
    names = [m.name for m in pkgutil.iter_modules(path)]
    return names if path is not None else names + list(sys.builtin_module_names)


def find_module(name: str) -> ModuleSpec:
    """The spec of module ``name``, found without executing any of it or its parents.

    Modules already imported are taken from ``sys.modules`` (``os.path`` is
    found there, not in ``os``'s folder).

    Raises
    ------
    UnknownModuleError
        ``name`` or one of its parents cannot be found, or a parent is not a package.
    """
    parts = name.split(".")
    path: list[str] | None = None
    spec: ModuleSpec | None = None
    for depth in range(1, len(parts) + 1):
        dotted = ".".join(parts[:depth])
        loaded = sys.modules.get(dotted)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None:
            spec = loaded.__spec__
            locations = getattr(loaded, "__path__", None)
        else:
            parent = ".".join(parts[: depth - 1])
            if depth > 1 and path is None:
                raise UnknownModuleError(
                    f"no module named {name!r}: {parent!r} is a module, not a package"
                )
            spec = _find_spec(dotted, path)
            if spec is None:
                known = [f"{parent}.{n}" if parent else n for n in _submodules(path)]
                raise UnknownModuleError(f"no module named {dotted!r}{did_you_mean(dotted, known)}")
            locations = spec.submodule_search_locations
        path = list(locations) if locations is not None else None
    assert spec is not None
    return spec


# -- one reference -------------------------------------------------------------------------


def _no_attribute(ref: str, module: str, part: str, known: Iterable[str]) -> UnknownFunctionError:
    known = [n for n in known if not n.startswith("_") or part.startswith("_")]
    return UnknownFunctionError(
        f"fn {ref!r}: {module!r} has no attribute {part!r}{did_you_mean(part, known)}"
    )


def _source_of(spec: ModuleSpec) -> tuple[str | None, str]:
    """The ``.py`` file of ``spec``, or ``None`` and why there is none."""
    origin = spec.origin
    if origin in (None, "namespace") and spec.submodule_search_locations is not None:
        return None, f"{spec.name!r} is a namespace package, with no source to read"
    if origin in ("built-in", "frozen"):
        return None, f"{spec.name!r} is a {origin} module, with no source to read"
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return None, f"{spec.name!r} has no Python source ({origin or 'no file'})"
    return origin, ""


def check_reference(ref: str, specs: dict[str, ModuleSpec] | None = None) -> str | None:
    """Check ``ref`` without importing it.

    ``specs`` caches the modules found (by name) across calls.

    Returns
    -------
    str or None
        ``None`` when the module exists and binds the name at top level; else
        why that could not be settled statically.

    Raises
    ------
    StepFunctionError
        A subclass, when the reference is definitely wrong.
    """
    module, attr = split_ref(ref)
    specs = {} if specs is None else specs
    try:
        spec = specs.get(module) or specs.setdefault(module, find_module(module))
    except UnknownModuleError as exc:
        raise UnknownModuleError(f"fn {ref!r}: {exc}") from None
    first, _, rest = attr.partition(".")
    source, reason = _source_of(spec)
    if source is None:
        loaded = sys.modules.get(module)
        if loaded is None:
            return reason
        if not hasattr(loaded, first):  # already imported by someone: look, don't guess
            raise _no_attribute(ref, module, first, dir(loaded))
        return None if not rest else f"{attr!r}: only {first!r} was checked"
    try:
        names = module_names(source)
    except SyntaxError as exc:
        raise ModuleImportError(
            f"fn {ref!r}: {source}:{exc.lineno}: the module does not parse: {exc.msg}"
        ) from None
    except (OSError, ValueError) as exc:
        return f"{source} cannot be read ({exc})"
    if first not in names.bound:
        dynamic = names.dynamic or binds_dynamically(source, first)
        if dynamic:
            return f"{source} binds no {first!r} by name, but it {dynamic}"
        raise _no_attribute(ref, module, first, names.bound)
    if not rest:
        return None
    members = names.classes.get(first)
    if members is not None and rest in members:
        return None
    return f"{attr!r}: only {first!r} was checked (attributes are looked up when run)"


def _functions(step: Any, into: str = "") -> Iterable[tuple[str, Any]]:
    """``(label, fn)`` of ``step`` and, for a fused step, of each member it runs."""
    yield (f"step {step.name!r}{into}", step.fn)
    for member in getattr(step.fn, "members", ()):  # a fused step (core.rewrite.FusedSteps)
        yield from _functions(member, f" (fused into {step.name!r})")


def check_references(plan: Any) -> list[Unchecked]:
    """Check every text reference of ``plan.steps`` without importing (see the module doc).

    Functions given as callables need no check; the members of a fused step are
    checked as steps of their own.

    Returns
    -------
    list of Unchecked
        The references that could not be settled statically, in plan order.

    Raises
    ------
    StepFunctionError
        For the first reference that is definitely wrong; the message starts
        with the step.
    """
    unchecked = []
    specs: dict[str, ModuleSpec] = {}
    for step in plan.steps:
        for label, fn in _functions(step):
            if not isinstance(fn, str):
                continue
            try:
                reason = check_reference(fn, specs)
            except StepFunctionError as exc:
                raise type(exc)(f"{label}: {exc}") from None
            if reason is not None:
                unchecked.append(Unchecked(label, fn, reason))
    return unchecked


# -- resolving: import for real ----------------------------------------------------------


def _unknown_module(ref: str, module: str, exc: ModuleNotFoundError) -> StepFunctionError:
    """``exc`` raised while importing ``module``: a misspelling, or a broken import inside?"""
    missing = exc.name or ""
    if missing and (module == missing or module.startswith(missing + ".")):
        try:
            find_module(module)
        except UnknownModuleError as unknown:
            return UnknownModuleError(f"fn {ref!r}: {unknown}")
    return ModuleImportError(f"fn {ref!r}: importing {module!r} failed: {exc}")


def resolve_fn(ref: Callable[..., Any] | str) -> Callable[..., Any]:
    """Import a ``"module:attr"`` reference (``"module.attr"`` also works).

    Raises
    ------
    StepFunctionError
        A subclass per failure: the form, an unknown module (with close
        names), a module whose import fails, an unknown attribute (with close
        names), something not callable.
    """
    if callable(ref):
        return ref
    module_name, attr = split_ref(ref)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _unknown_module(ref, module_name, exc) from exc
    except Exception as exc:
        raise ModuleImportError(
            f"fn {ref!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    owner = module_name
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _no_attribute(ref, owner, part, dir(obj)) from None
        owner = f"{owner}:{part}" if owner == module_name else f"{owner}.{part}"
    if not callable(obj):
        raise NotCallableError(f"fn {ref!r} is a {type(obj).__name__}, which is not callable")
    return obj


def resolve_functions(plan: Any) -> dict[str, Callable[..., Any]]:
    """Import every function of ``plan.steps``, before any of them runs.

    Returns
    -------
    dict
        Step name -> its function.

    Raises
    ------
    StepFunctionError
        For the first step whose function cannot be resolved; the message
        starts with the step.
    """
    functions = {}
    for step in plan.steps:
        for label, fn in _functions(step):  # a fused step's members are imported too
            functions.setdefault(step.name, _resolve_for(label, fn))
    return functions


def resolve_unchecked(unchecked: Iterable[Unchecked]) -> None:
    """Import only what :func:`check_references` could not settle.

    For a process that runs no step (``flexgraph run``'s launcher): every other
    reference is known to exist, and its ranks import them all before their
    first step. Raises as :func:`resolve_functions` does.
    """
    for item in unchecked:
        _resolve_for(item.where, item.ref)


def _resolve_for(label: str, fn: Callable[..., Any] | str) -> Callable[..., Any]:
    """:func:`resolve_fn`, its error message starting with ``label`` (the step)."""
    try:
        return resolve_fn(fn)
    except StepFunctionError as exc:
        raise type(exc)(f"{label}: {exc}") from exc.__cause__
