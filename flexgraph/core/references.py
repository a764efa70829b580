"""Function references (``"module:attr"``): checked without importing, or resolved up front.

``flexgraph plan`` finds modules one dotted part at a time, so no package's
``__init__`` runs, and reads their source with :mod:`ast`; what that cannot
settle comes back as :class:`Unchecked`.
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
    """A step's function reference cannot be resolved (base of the classes below)."""


class FunctionReferenceFormError(StepFunctionError):
    """The reference is not of the form ``'module:attr'``."""


class UnknownModuleError(StepFunctionError):
    """No module of the referenced name can be found."""


class ModuleImportError(StepFunctionError):
    """The module exists, but importing it failed."""


class UnknownFunctionError(StepFunctionError):
    """The module has no attribute of the referenced name."""


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
    """``"pkg.mod:attr"`` (or ``"pkg.mod.attr"``) as ``("pkg.mod", "attr")``."""
    module, sep, attr = ref.partition(":")
    if not sep:
        module, _, attr = ref.rpartition(".")
    if not module or not attr:
        raise FunctionReferenceFormError(f"fn {ref!r} is not of the form 'module:attr'")
    return module, attr


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
    """The spec of module ``name``, found without running it or its parents."""
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
    """``None`` when ``ref``'s module binds its name at top level, else why that is unsettled.

    Raises a :class:`StepFunctionError` when ``ref`` is wrong; ``specs`` caches modules found.
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
    """Check every text reference of ``plan.steps``, importing none; the unsettled ones."""
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
    """Import a ``"module:attr"`` reference (a callable is returned as it is)."""
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
    """Step name -> function, for every step of ``plan``, imported before any runs."""
    functions = {}
    for step in plan.steps:
        for label, fn in _functions(step):  # a fused step's members are imported too
            functions.setdefault(step.name, _resolve_for(label, fn))
    return functions


def resolve_unchecked(unchecked: Iterable[Unchecked]) -> None:
    """Import only what :func:`check_references` left unchecked (a process that runs no step)."""
    for item in unchecked:
        _resolve_for(item.where, item.ref)


def _resolve_for(label: str, fn: Callable[..., Any] | str) -> Callable[..., Any]:
    try:
        return resolve_fn(fn)
    except StepFunctionError as exc:
        raise type(exc)(f"{label}: {exc}") from exc.__cause__
