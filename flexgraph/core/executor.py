"""The executor: runs a plan's steps in order over a context of artifacts.

Every function is resolved before the first step runs, so a misspelt reference
fails with nothing run. A contract returns ``None`` when it holds, else what is
wrong and the fix; one judged only during training takes ``report`` instead.
"""

from __future__ import annotations

import functools
import inspect
import resource
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import attrs

from flexgraph.core.errors import FlexgraphError, did_you_mean
from flexgraph.core.graph import MissingInputError
from flexgraph.core.plan import Plan
from flexgraph.core.references import resolve_fn, resolve_functions
from flexgraph.core.step import Step, run_step


class StepFailedError(FlexgraphError, RuntimeError):
    """A step raised; ``step`` and ``origin`` name it, the original error is ``__cause__``."""

    def __init__(self, message: str, step: str = "", origin: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.origin = origin


class ContractError(FlexgraphError, RuntimeError):
    """A step's contract does not hold; ``step`` and ``contract`` name them."""

    def __init__(self, message: str, step: str = "", contract: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.contract = contract


def _contract_name(ref: str) -> str:
    return ref.rpartition(":")[2]


@attrs.define
class StepRecord:
    """What happened when a step ran; ``status``: ``planned``, ``ok`` or ``failed``."""

    name: str
    origin: str
    status: str = "planned"
    seconds: float = 0.0
    rss_mib: float | None = None
    peak_rss_mib: float | None = None


def memory_mib() -> tuple[float | None, float]:
    """(resident memory, high-water mark) in MiB from ``/proc/self/status``; ``ru_maxrss`` lags."""
    try:
        with open("/proc/self/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(fields[b"VmRSS"].split()[0]) / 1024, int(fields[b"VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return None, peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


@attrs.define
class RunResult:
    """The final context of artifacts and one record per step, in order."""

    context: dict[str, Any]
    records: list[StepRecord]


class Executor:
    """Runs plans; each of ``hooks`` may define ``before_step(step, context)``,
    ``after_step(step, context, record)`` and ``on_error(step, context, error)``.

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
        """Run ``plan`` over ``context``; ``dry_run`` checks inputs and functions, runs nothing."""
        context = dict(context or {})
        missing = sorted(a for a in plan.graph.inputs if a not in context)
        if missing:
            hint = did_you_mean(missing[0], context)
            raise MissingInputError(
                f"the plan needs input {missing[0]!r}, which the run was not given{hint}"
            )
        functions = resolve_functions(plan)
        contracts = {ref: resolve_fn(ref) for step in plan.steps
                     for ref in step.expects + step.contracts}
        records = [StepRecord(name, plan.origin(name).short) for name in plan.order]
        if dry_run:
            return RunResult(context, records)
        for step, record in zip(plan.steps, records, strict=True):
            self.check_contracts(step, step.expects, contracts, context, "before it ran")
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
            record.rss_mib, record.peak_rss_mib = memory_mib()
            context.update(outputs)
            self.check_contracts(step, step.contracts, contracts, context, "after it ran")
            self._fire("after_step", step, context, record)
        return RunResult(context, records)

    def check_contracts(self, step: Step, refs: tuple[str, ...],
                        functions: Mapping[str, Any], context: Mapping[str, Any],
                        when: str) -> None:
        """Run ``step``'s contracts ``refs`` over ``context``; the first broken one stops it."""
        available = {**context, "params": step.params}
        for ref in refs:
            check = functions[ref]
            available["report"] = functools.partial(_break_contract, step.name, ref,
                                                    "during training")
            names = inspect.signature(check).parameters
            problem = check(**{name: available[name] for name in names if name in available})
            if problem:
                _break_contract(step.name, ref, when, problem)


def _break_contract(step: str, ref: str, when: str, problem: str) -> NoReturn:
    """Stop the run: ``step``'s contract ``ref`` found ``problem``."""
    raise ContractError(f"step {step!r} broke contract {_contract_name(ref)!r} {when}: "
                        f"{problem}", step=step, contract=_contract_name(ref))
