"""The executor: runs a plan's steps in order over a context of artifacts.

It fires hooks around each step, records each step's wall time and memory, and
on failure raises :class:`StepFailedError` naming the step and its origin, with
the original exception chained. Before the first step it resolves every step's
function, so a misspelled reference fails before anything has run. A dry run
checks the inputs and the functions and executes nothing.

Memory: ``peak_rss_mib`` is the process's peak resident set size when the step
ended (``getrusage``), so the step that raised the peak shows the jump;
``rss_mib`` is the resident size right after it.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs

from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.graph import MissingInputError
from flexgraph.core.plan import Plan
from flexgraph.core.references import resolve_functions
from flexgraph.core.step import Step, run_step


class StepFailedError(FlexgraphError, RuntimeError):
    """A step raised; the original exception is chained as ``__cause__``.

    The message names the step, its origin and the original error:
    ``step 'train' (base) failed: ValueError: ...``. Raised by
    :meth:`Executor.run`; an exception that is not an :class:`Exception`
    (``KeyboardInterrupt``, a stop on a signal) passes through unwrapped.

    Parameters
    ----------
    message : str
    step : str, optional
        The step that raised; kept as the ``step`` attribute.
    origin : str, optional
        Where its place in the plan came from (``str(Origin)``); kept as the
        ``origin`` attribute.
    """

    def __init__(self, message: str, step: str = "", origin: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.origin = origin


@attrs.define
class StepRecord:
    """What happened when a step ran.

    Parameters
    ----------
    name : str
        The step.
    origin : str
        Its origin, short form (:attr:`Origin.short`).
    status : str
        ``"planned"`` (not run: a dry run, or after a failure), ``"ok"`` or
        ``"failed"``.
    seconds : float
        Wall time of the step's function.
    rss_mib : float or None
        Resident memory right after the step, in MiB (``None`` where
        ``/proc`` cannot be read, and for a step that did not finish).
    peak_rss_mib : float or None
        The process's peak resident memory when the step ended, in MiB.
    """

    name: str
    origin: str
    status: str = "planned"
    seconds: float = 0.0
    rss_mib: float | None = None
    peak_rss_mib: float | None = None


class ExecutorHook(Protocol):
    """Methods an executor hook may define; each is optional."""

    def before_step(self, step: Step, context: Mapping[str, Any]) -> None: ...

    def after_step(self, step: Step, context: Mapping[str, Any], record: StepRecord) -> None: ...

    def on_error(self, step: Step, context: Mapping[str, Any], error: BaseException) -> None: ...


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _rss_mib() -> float | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except OSError:
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


@attrs.define
class RunResult:
    """The final context of artifacts and one record per step, in order.

    Parameters
    ----------
    context : dict
        Artifact name -> value: the inputs, updated by every step's outputs.
    records : list of StepRecord
        One per step, in execution order.
    """

    context: dict[str, Any]
    records: list[StepRecord]


class Executor:
    """Run plans. ``hooks`` are objects with any of the :class:`ExecutorHook` methods.

    Parameters
    ----------
    hooks : iterable of object, optional
        Each may define ``before_step(step, context)``,
        ``after_step(step, context, record)`` and
        ``on_error(step, context, error)``; they are called in this order for
        every step.

    Examples
    --------
    >>> from flexgraph import Graph, step, make_plan
    >>> @step(provides="y")
    ... def double(x):
    ...     return 2 * x
    >>> Executor().run(make_plan(Graph.of([double], inputs=["x"])), {"x": 21}).context["y"]
    42
    """

    def __init__(self, hooks: Iterable[object] = ()) -> None:
        self.hooks = list(hooks)

    def _fire(self, point: str, *args: Any) -> None:
        for hook in self.hooks:
            method = getattr(hook, point, None)
            if method is not None:
                method(*args)

    def run(
        self, plan: Plan, context: Mapping[str, Any] | None = None, *, dry_run: bool = False
    ) -> RunResult:
        """Run ``plan`` over ``context`` (the graph's inputs) and return the result.

        Every step's function is resolved before the first step runs. Each step
        is called with its inputs from the context, and its outputs go back
        into the context for the steps after it.

        Parameters
        ----------
        plan : Plan
        context : mapping, optional
            Values of the graph's inputs (``{"cfg": cfg}``); other entries
            are passed through to the result's context.
        dry_run : bool, optional
            Check the inputs and resolve the functions, run nothing: every
            record stays ``"planned"``.

        Returns
        -------
        RunResult

        Raises
        ------
        MissingInputError
            ``context`` lacks one of the graph's inputs.
        StepFunctionError
            A step's function cannot be resolved (raised before any step runs).
        StepFailedError
            A step raised; ``__cause__`` is the original error.
        """
        context = dict(context or {})
        missing = sorted(a for a in plan.graph.inputs if a not in context)
        if missing:
            hint = did_you_mean(missing[0], context)
            raise MissingInputError(
                f"the plan needs input {missing[0]!r}, which the run was not given{hint}"
            )
        functions = resolve_functions(plan)
        records = [StepRecord(name, plan.origin(name).short) for name in plan.order]
        if dry_run:
            return RunResult(context, records)
        for step, record in zip(plan.steps, records, strict=True):
            self._fire("before_step", step, context)
            start = time.perf_counter()
            try:
                outputs = run_step(step, context, functions[step.name])
            except BaseException as exc:
                record.status = "failed"
                record.seconds = time.perf_counter() - start
                self._fire("on_error", step, context, exc)
                if not isinstance(exc, Exception):
                    raise
                origin = str(plan.origin(step.name))
                raise StepFailedError(
                    f"step {step.name!r} ({origin}) failed: {type(exc).__name__}: {exc}",
                    step=step.name,
                    origin=origin,
                ) from exc
            record.seconds = time.perf_counter() - start
            record.status = "ok"
            record.rss_mib = _rss_mib()
            record.peak_rss_mib = _peak_rss_mib()
            context.update(outputs)
            self._fire("after_step", step, context, record)
        return RunResult(context, records)
