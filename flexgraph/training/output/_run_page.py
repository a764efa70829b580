"""What each step cost on every rank: ``timings.txt`` and ``plan.html`` in the run's folder."""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flexgraph.core.executor import StepRecord
from flexgraph.core.plan import Plan
from flexgraph.training.output._memory import RunEstimate, _bytes, _cuda_peak_bytes
from flexgraph.training.output._workdir import _atomic_text

TIMINGS_FILE = "timings.txt"
PAGE_FILE = "plan.html"


def _every_rank(mine: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every rank's records, in rank order; this rank's alone without a process group."""
    dist = sys.modules.get("torch.distributed")  # a run that never imported it has no group
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [mine]
    from flexgraph.training.runtime import gathered_from_every_rank

    return gathered_from_every_rank(mine)


class StepTimings:
    """Executor hook: every step's record as it ends; every rank's once the last step ends.

    Parameters
    ----------
    plan : Plan
    console : rich.console.Console, optional
        Gets the timings table before the last step (a training's setup, before
        it trains) or, with ``after_last``, after it (a pipeline's every step).
    after_last : bool, default False
    """

    def __init__(self, plan: Plan, console: Any = None, *, after_last: bool = False) -> None:
        self.last = plan.order[-1]
        self.console = console
        self.after_last = after_last
        self.records: list[StepRecord] = []
        self.by_rank: list[list[dict[str, Any]]] | None = None
        self._mine: list[dict[str, Any]] = []

    def before_step(self, step: Any, context: Any) -> None:
        if step.name == self.last and not self.after_last:
            self._print()

    def after_step(self, step: Any, context: Any, record: StepRecord) -> None:
        self.records.append(record)
        self._mine.append({"step": step.name, "origin": record.origin, "status": record.status,
                           "seconds": record.seconds, "rss_bytes": _bytes(record.rss_mib),
                           "peak_rss_bytes": _bytes(record.peak_rss_mib),
                           "device_peak_bytes": _cuda_peak_bytes()})
        if step.name == self.last:
            self.by_rank = _every_rank(self._mine)
            if self.after_last:
                self._print()

    def _print(self) -> None:
        if self.console is not None and self.records:
            from flexgraph.render import timings_table

            self.console.print(timings_table(self.records))


def _as_record(row: dict[str, Any]) -> StepRecord:
    mib = 1024 * 1024
    return StepRecord(row["step"], row["origin"], row["status"], row["seconds"],
                      None if row["rss_bytes"] is None else row["rss_bytes"] / mib,
                      None if row["peak_rss_bytes"] is None else row["peak_rss_bytes"] / mib)


def timings_text(by_rank: Sequence[Sequence[dict[str, Any]]]) -> str:
    """The timings table of each rank, as plain text."""
    from rich.console import Console

    from flexgraph.render import timings_table

    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None, highlight=False)
    for rank, rows in enumerate(by_rank):
        console.print(timings_table([_as_record(r) for r in rows], title=f"step timings, rank "
                                    f"{rank} of {len(by_rank)}"))
        console.print()
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


def write_run_page(run_dir: Path, plan: Plan, by_rank: Sequence[Sequence[dict[str, Any]]], *,
                   estimate: RunEstimate | None = None, checks: Sequence[Any] = ()) -> None:
    """``run_dir``'s ``timings.txt`` and ``plan.html`` (the plan, measured beside estimated).

    Parameters
    ----------
    run_dir : Path
    plan : Plan
    by_rank : sequence of sequence of dict
        :attr:`StepTimings.by_rank`.
    estimate : RunEstimate, optional
    checks : sequence, optional
        The strategy's checks: the reasons of its orders.

    Raises
    ------
    OSError
        A file could not be written (neither is then left half-written).
    """
    from flexgraph.render.html import plan_page

    report = estimate.as_report() if estimate is not None else None
    page = plan_page(plan, checks=checks, estimate=report, measured=by_rank,
                     source=str(run_dir.name))
    for name, text in ((TIMINGS_FILE, timings_text(by_rank)), (PAGE_FILE, page)):
        _atomic_text(run_dir / name, lambda path, text=text: Path(path).write_text(
            text, encoding="utf-8"))
