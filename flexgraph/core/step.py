"""Steps: named units of work with declared inputs and outputs.

The function may be a ``"module:attr"`` reference, resolved only when the plan
runs, so planning never imports the modules steps live in (nor torch).

The calling contract: the function gets one keyword argument per name in
``requires`` and ``updates``, plus the bound ``params``. It returns nothing for
no outputs, the value itself for one, and a mapping (or a tuple in declared
order) for several. Outputs are ``provides`` followed by ``updates``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from flexgraph.core.errors import FlexgraphError
from flexgraph.core.references import StepFunctionError as StepFunctionError  # re-exported
from flexgraph.core.references import resolve_fn

MODEL = "model"
"""The artifact whose state facts describe (see :mod:`flexgraph.core.states`)."""


class StepDefinitionError(FlexgraphError, ValueError):
    """A step is malformed; the message names the step and the field."""


def _names(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _frozen_params(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


def fn_ref(fn: Callable[..., Any] | str) -> str:
    """The ``"module:qualname"`` text that names ``fn``.

    Parameters
    ----------
    fn : callable or str

    Returns
    -------
    str
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
    if step.gives or step.ends or step.needs:
        _check_facts(step)


def _check_facts(step: Step) -> None:
    for field in ("gives", "ends", "needs"):
        for fact in getattr(step, field):
            if not isinstance(fact, str) or not fact.isidentifier():
                raise StepDefinitionError(
                    f"step {step.name!r}: {field} has {fact!r}; a fact is a short name "
                    "('loaded', 'whole')")
    both = set(step.gives) & set(step.ends)
    if both:
        raise StepDefinitionError(
            f"step {step.name!r} both gives and ends {sorted(both)[0]!r}; keep one")
    if step.needs and MODEL not in step.requires + step.updates:
        raise StepDefinitionError(
            f"step {step.name!r} needs {list(step.needs)} of the {MODEL}, but neither "
            f"requires nor updates {MODEL!r}; add it to requires or updates")


@attrs.frozen(eq=True)
class Step:
    """One named unit of work. Immutable; :meth:`evolve` makes a changed copy.

    Parameters
    ----------
    name : str
        A Python identifier; configs, specs and rewrites use it.
    fn : callable or str
    requires, provides, updates : str or tuple of str
        Artifacts read, created, and read-and-replaced.
    after, before : str or tuple of str
        Steps this one must run after / before.
    params : mapping
        Keyword arguments bound to the function.
    doc : str
        One line shown in plans; not part of equality.
    gives, ends, needs : str or tuple of str
        Facts about the ``model`` this step makes true, makes false, and needs
        (:mod:`flexgraph.core.states`).
    contracts, expects : str or tuple of str
        ``"module:function"`` checks run after this step, and before it.
    user : str
        Where a user added this step to a graph they did not write
        (``"custom_steps"``); its anchors keep their base-graph meaning.

    Examples
    --------
    >>> s = Step("load", fn="json:loads", requires="text", provides="data")
    >>> s.inputs, s.outputs
    (('text',), ('data',))
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
    gives: tuple[str, ...] = attrs.field(default=(), converter=_names)
    ends: tuple[str, ...] = attrs.field(default=(), converter=_names)
    needs: tuple[str, ...] = attrs.field(default=(), converter=_names)
    user: str = attrs.field(default="", eq=False)
    contracts: tuple[str, ...] = attrs.field(default=(), converter=_names)
    expects: tuple[str, ...] = attrs.field(default=(), converter=_names)

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
        """A copy with ``changes`` (fields by name) applied."""
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
    needs: str | Iterable[str] | None = None,
    gives: str | Iterable[str] | None = None,
    ends: str | Iterable[str] | None = None,
) -> Any:
    """Make a :class:`Step` from a function; usable as a bare or called decorator.

    Parameters
    ----------
    fn : callable, optional
        The function; omitted, ``step(...)`` returns a decorator.
    name : str, optional
        Defaults to the function's ``__name__``.
    requires : str or iterable of str, optional
        Defaults to the function's parameters without a default, less ``updates``.
    provides, updates, after, before, params, needs, gives, ends : optional
        As in :class:`Step`.

    Returns
    -------
    Step, or a decorator returning a Step

    Examples
    --------
    >>> @step(provides="total")
    ... def add(a, b, scale=1):
    ...     "Sum two numbers."
    ...     return scale * (a + b)
    >>> add.name, add.requires, add.doc
    ('add', ('a', 'b'), 'Sum two numbers.')
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
            needs=_names(needs),
            gives=_names(gives),
            ends=_names(ends),
        )

    return make(fn) if fn is not None else make


class StepOutputError(FlexgraphError, TypeError):
    """A step's function returned something that does not match its outputs."""


def run_step(
    step: Step, artifacts: Mapping[str, Any], func: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """Call ``step``'s function on its inputs from ``artifacts`` (the calling contract).

    Parameters
    ----------
    step : Step
    artifacts : Mapping of str to Any
    func : callable, optional
        ``step.fn`` already resolved.

    Returns
    -------
    dict of str to Any
        The step's outputs by name.
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
