"""A run's measured memory next to its estimate: ``work_dir/<timestamp>/memory.json``.

Only a run that has an estimate records this: ``flexgraph run --estimate``, or
``--strategy auto`` (which estimated to choose). Other runs pay nothing. The
estimate is the per-rank peak of one training step (``flexgraph plan
--estimate``); the measurement is rank 0's, taken as each step ends:

* on CUDA, ``torch.cuda.max_memory_allocated`` (allocated tensor bytes, what
  the estimate counts), so the ratio is meaningful;
* elsewhere, the rank's peak resident set size. The CPU allocator does not
  track live tensor bytes, and RSS also holds the interpreter, torch's
  libraries and the data loader, so it is shown beside the estimate, labelled,
  without a ratio.

The launcher estimates once and hands the figure to its ranks
(:data:`~flexgraph.training.output.RUN_ESTIMATE_VAR`). The JSON object
(``flexgraph.run-memory/1``)::

    {"schema": "flexgraph.run-memory/1",
     "estimate": {"candidate": "ddp", "peak_bytes": 123, "phase": "backward",
                  "world_size": 2, "step": "train"},
     "measured": {"source": "peak RSS of rank 0", "peak_bytes": 456,
                  "comparable": false, "ratio": null},
     "steps": [{"step": "build_model", "peak_rss_bytes": 400, "cuda_peak_bytes": null,
                "estimate_bytes": null}, ...]}

``estimate_bytes`` is set on the step that trains (the plan's last), the
one the estimate describes; ``ratio`` is measured / estimate where comparable.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

SCHEMA = "flexgraph.run-memory/1"
MEMORY_FILE = "memory.json"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class RunEstimate:
    """The estimate a run is measured against: one candidate's per-rank peak.

    Parameters
    ----------
    candidate : str
        The estimated candidate (``'ddp'``, ``'deepspeed:zero2'``).
    peak_bytes : int
        Its estimated per-rank peak.
    phase : str
        Where the estimate reaches that peak.
    world_size : int
        The ranks the estimate is for.
    """

    candidate: str
    peak_bytes: int
    phase: str
    world_size: int

    @classmethod
    def from_report(cls, report: dict[str, Any], label: str) -> RunEstimate:
        """The row ``label`` of a ``flexgraph.estimate/1`` report."""
        row = next(r for r in report["candidates"] if r["candidate"] == label)
        return cls(label, int(row["peak_bytes"]), str(row["phase"]), int(report["world_size"]))

    def to_json(self) -> str:
        """This estimate as the launcher hands it to its ranks
        (:data:`~flexgraph.training.output.RUN_ESTIMATE_VAR`)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> RunEstimate | None:
        """The estimate :meth:`to_json` wrote (``None`` for no text: none was handed down)."""
        return cls(**json.loads(text)) if text else None


def _cuda_peak_bytes() -> int | None:
    """``torch.cuda.max_memory_allocated``, where the run has used CUDA (else ``None``)."""
    torch = sys.modules.get("torch")  # a run that never imported torch used no CUDA
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated())


class MeasuredPeaks:
    """Executor hook: each step's peak (RSS, and CUDA's allocated peak) as it ends."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def after_step(self, step: Any, context: Any, record: Any) -> None:
        rss = record.peak_rss_mib
        self.steps.append({"step": step.name,
                           "peak_rss_bytes": None if rss is None else int(rss * _MIB),
                           "cuda_peak_bytes": _cuda_peak_bytes(),
                           "estimate_bytes": None})


def memory_summary(estimate: RunEstimate, steps: list[dict[str, Any]],
                   rank: int = 0) -> dict[str, Any]:
    """The ``flexgraph.run-memory/1`` object for a finished run's ``steps``.

    Parameters
    ----------
    estimate : RunEstimate
        The estimate the run is measured against.
    steps : list of dict
        The measured peaks of the run's steps, in order.
    rank : int, default 0
        The rank that measured them.

    Returns
    -------
    dict
        The summary ``memory.json`` holds: estimate, measured peak and its source,
        the ratio where the two compare, the steps.
    """
    steps = [dict(s) for s in steps]
    cuda = [s["cuda_peak_bytes"] for s in steps if s["cuda_peak_bytes"] is not None]
    if cuda:
        source, peak = f"torch.cuda.max_memory_allocated of rank {rank}", max(cuda)
    else:
        rss = [s["peak_rss_bytes"] for s in steps if s["peak_rss_bytes"] is not None]
        source, peak = f"peak RSS of rank {rank}", max(rss, default=None)
    trains = steps[-1]["step"] if steps else None
    if steps:
        steps[-1]["estimate_bytes"] = estimate.peak_bytes
    comparable = bool(cuda) and estimate.peak_bytes > 0
    return {
        "schema": SCHEMA,
        "estimate": {**asdict(estimate), "step": trains},
        "measured": {"source": source, "peak_bytes": peak, "comparable": comparable,
                     "ratio": round(peak / estimate.peak_bytes, 3) if comparable else None},
        "steps": steps,
    }


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / _MIB:.1f} MiB"


def summary_line(summary: dict[str, Any]) -> str:
    """One line for the console: estimate, measured (with its source), ratio where it means one.

    Parameters
    ----------
    summary : dict
        The run's memory summary (:func:`memory_summary`).

    Returns
    -------
    str
        The line, without a newline.
    """
    est, measured = summary["estimate"], summary["measured"]
    line = (f"memory: estimated {_size(est['peak_bytes'])} per rank ({est['candidate']}, "
            f"{est['phase']}), measured {_size(measured['peak_bytes'])} ({measured['source']}")
    if measured["ratio"] is not None:
        return line + f"; ratio {measured['ratio']:.2f})"
    return line + ": the whole process, no ratio)"
