"""Steps: named units of work with declared inputs and outputs.

A step is a plain function plus what it ``requires`` (artifacts it reads),
``provides`` (artifacts it creates), ``updates`` (artifacts it reads and
replaces in place, like ``init_weights`` on ``model``) and pure ordering edges
``after`` / ``before``. Steps are immutable values: rewrites make new ones.

The function may be given as a callable or as a ``"module:attr"`` reference.
References are resolved only when the plan runs (all of them before its first
step, see :mod:`flexgraph.core.references`), so planning a graph never imports
the modules its steps live in (planning the training graph must not import torch).

Contract for the function: it is called with one keyword argument per name in
``requires`` and ``updates``, plus the bound ``params``. It returns nothing when
the step has no outputs, the value itself when it has exactly one, and a mapping
(or a tuple in declared order) when it has several. Outputs are ``provides``
followed by ``updates``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.references import StepFunctionError as StepFunctionError  # its old home
from flexgraph.core.references import resolve_fn


class StepDefinitionError(FlexgraphError, ValueError):
    """A step is malformed: bad name, an artifact declared twice, a bad fn.

    Raised when a :class:`Step` is made: its name is not a Python identifier,
    an artifact is not a non-empty string, an artifact is listed twice or in
    two of ``requires`` / ``provides`` / ``updates``, or the step is ordered
    relative to itself. The message names the step and the field.
    """


def _names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _frozen_params(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


def fn_ref(fn: Callable[..., Any] | str) -> str:
    """Return the ``"module:qualname"`` text that names ``fn``.

    Parameters
    ----------
    fn : callable or str
        A function, or already its reference text.

    Returns
    -------
    str
        ``"module:qualname"`` (a fused step's own ``flexgraph_ref``).
    """
    if isinstance(fn, str):
        return fn
    if hasattr(fn, "flexgraph_ref"):
        return fn.flexgraph_ref
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}:{qualname}"


def _check(step: Step, attribute: attrs.Attribute, value: object) -> None:
    del attribute, value
    if not step.name or not isinstance(step.name, str) or not step.name.isidentifier():
        raise StepDefinitionError(f"step name {step.name!r} must be a Python identifier")
    seen: dict[str, str] = {}
    for field in ("requires", "provides", "updates"):
        for artifact in getattr(step, field):
            if not isinstance(artifact, str) or not artifact:
                raise StepDefinitionError(
                    f"step {step.name!r}: {field} has a non-name {artifact!r}"
                )
            if seen.get(artifact) == field:
                raise StepDefinitionError(
                    f"step {step.name!r} lists artifact {artifact!r} twice in {field}"
                )
            if artifact in seen:
                raise StepDefinitionError(
                    f"step {step.name!r} declares artifact {artifact!r} in both "
                    f"{seen[artifact]} and {field}; an artifact it changes belongs in updates only"
                )
            seen[artifact] = field
    if step.name in step.after or step.name in step.before:
        raise StepDefinitionError(f"step {step.name!r} cannot be ordered relative to itself")


@attrs.frozen(eq=True)
class Step:
    """One named unit of work. Immutable; use :meth:`evolve` to change it.

    Parameters
    ----------
    name : str
        Public, stable name (configs, specs and rewrites refer to it).
    fn : callable or str
        The function, or a ``"module:attr"`` reference resolved at run time.
    requires, provides, updates : tuple of str
        Artifacts read, created, and read-and-replaced.
    after, before : tuple of str
        Names of steps this one must run after / before (pure ordering).
    params : mapping
        Keyword arguments bound to the function (``Configure`` edits them).
    doc : str
        One line saying what the step does, shown in plans.

    ``requires``, ``provides``, ``updates``, ``after`` and ``before`` also take
    a single name, or ``None`` for none. Two steps are equal when every field
    but ``doc`` is; a callable ``fn`` compares by its ``"module:qualname"``.

    Raises
    ------
    StepDefinitionError
        The name is not a Python identifier, an artifact is listed twice (or in
        two of ``requires`` / ``provides`` / ``updates``), or the step is
        ordered relative to itself.

    See Also
    --------
    step : make a step from a function, its ``requires`` read off the signature.

    Examples
    --------
    >>> s = Step("load", fn="json:loads", requires="text", provides="data")
    >>> s.inputs, s.outputs
    (('text',), ('data',))
    >>> s.evolve(name="parse").name
    'parse'
    """

    name: str = attrs.field(validator=_check)
    fn: Callable[..., Any] | str = attrs.field(eq=fn_ref)
    requires: tuple[str, ...] = attrs.field(default=(), converter=_names)
    provides: tuple[str, ...] = attrs.field(default=(), converter=_names)
    updates: tuple[str, ...] = attrs.field(default=(), converter=_names)
    after: tuple[str, ...] = attrs.field(default=(), converter=_names)
    before: tuple[str, ...] = attrs.field(default=(), converter=_names)
    params: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_frozen_params, eq=lambda p: dict(p)
    )
    doc: str = attrs.field(default="", eq=False)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Artifacts the function receives: ``requires`` then ``updates``."""
        return self.requires + self.updates

    @property
    def outputs(self) -> tuple[str, ...]:
        """Artifacts the function returns: ``provides`` then ``updates``."""
        return self.provides + self.updates

    @property
    def fn_name(self) -> str:
        """The function as ``"module:qualname"`` text, for plans and errors."""
        return fn_ref(self.fn)

    def evolve(self, **changes: Any) -> Step:
        """Return a copy with ``changes`` applied (attrs.evolve).

        Parameters
        ----------
        **changes
            New values of fields, by name (``after=("load_checkpoint",)``).

        Returns
        -------
        Step

        Raises
        ------
        StepDefinitionError
            The changed step is malformed.
        """
        return attrs.evolve(self, **changes)


def step(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    requires: str | Iterable[str] | None = None,
    provides: str | Iterable[str] | None = None,
    updates: str | Iterable[str] | None = None,
    after: str | Iterable[str] | None = None,
    before: str | Iterable[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> Any:
    """Make a :class:`Step` from a plain function; usable as a bare or called decorator.

    Parameters
    ----------
    fn : callable, optional
        The function. Given, ``step(fn, ...)`` returns the step; omitted,
        ``step(...)`` returns a decorator that makes one.
    name : str, optional
        The step's name; defaults to the function's ``__name__``.
    requires : str or iterable of str, optional
        Defaults to the function's parameters that have no default value and
        are not in ``updates`` (positional-or-keyword and keyword-only ones).
    provides, updates, after, before : str or iterable of str, optional
        As in :class:`Step`.
    params : mapping, optional
        Keyword arguments bound to the function.

    Returns
    -------
    Step, or a decorator returning a Step
        The step's ``doc`` is the first line of the function's docstring.

    Raises
    ------
    StepDefinitionError
        The step is malformed (see :class:`Step`).

    Examples
    --------
    >>> @step(provides="total")
    ... def add(a, b, scale=1):
    ...     "Sum two numbers."
    ...     return scale * (a + b)
    >>> add.name, add.requires, add.doc
    ('add', ('a', 'b'), 'Sum two numbers.')
    >>> step(add.fn, name="add_twice", params={"scale": 2}).params["scale"]
    2
    """

    def make(func: Callable[..., Any]) -> Step:
        import inspect

        updated = _names(updates)
        if requires is None:
            signature = inspect.signature(func)
            needed = tuple(
                p.name
                for p in signature.parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.name not in updated
            )
        else:
            needed = _names(requires)
        doc = (inspect.getdoc(func) or "").strip().splitlines()
        return Step(
            name=name or func.__name__,
            fn=func,
            requires=needed,
            provides=_names(provides),
            updates=updated,
            after=_names(after),
            before=_names(before),
            params=params,
            doc=doc[0] if doc else "",
        )

    return make(fn) if fn is not None else make


class StepOutputError(FlexgraphError, TypeError):
    """A step's function returned something that does not match its outputs.

    A step with several outputs must return a mapping with exactly those keys,
    or a tuple of that length in declared order; the message names the step,
    what it returned and what was expected. Raised while the step runs, so the
    executor reports it as the cause of a :class:`~flexgraph.StepFailedError`.
    """


def run_step(
    step: Step, artifacts: Mapping[str, Any], func: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """Call ``step``'s function (``func``, if already resolved) on ``artifacts``.

    Parameters
    ----------
    step : Step
        The step to run.
    artifacts : Mapping of str to Any
        Every artifact so far; the step gets its inputs by name and its params.
    func : callable, optional
        ``step.fn`` already resolved (the executor resolves each once).

    Returns
    -------
    dict of str to Any
        The step's outputs by name (empty for a step with none).

    Raises
    ------
    StepOutputError
        When the return value does not match ``step.outputs``.
    """
    func = func if func is not None else resolve_fn(step.fn)
    result = func(**{name: artifacts[name] for name in step.inputs}, **step.params)
    outputs = step.outputs
    if not outputs:
        return {}
    if len(outputs) == 1:
        return {outputs[0]: result}
    if isinstance(result, Mapping):
        if set(result) != set(outputs):
            raise StepOutputError(
                f"step {step.name!r} returned keys {sorted(result)}, expected {list(outputs)}"
            )
        return dict(result)
    if isinstance(result, tuple) and len(result) == len(outputs):
        return dict(zip(outputs, result, strict=True))
    raise StepOutputError(
        f"step {step.name!r} has outputs {list(outputs)}: return a mapping with those keys"
    )
