"""A run's measured memory next to its estimate: ``work_dir/<timestamp>/memory.json``.

Only a run that has an estimate records this (``--estimate``, ``--strategy
auto``). Rank 0 measures as each step ends: on CUDA the allocated peak, which
the estimate counts, so a ratio is given; elsewhere the peak RSS, which also
holds the interpreter and its libraries, so no ratio. For setup, every rank's
peak RSS rise above its first step is compared with the setup estimate. The
JSON object (``flexgraph.run-memory/1``)::

    {"schema": "flexgraph.run-memory/1",
     "estimate": {"candidate": "ddp", "peak_bytes": 123, "phase": "backward",
                  "world_size": 2, "setup_rank0_bytes": 50, "setup_other_bytes": 50,
                  "step": "train"},
     "measured": {"source": "peak RSS of rank 0", "peak_bytes": 456,
                  "comparable": false, "ratio": null},
     "steps": [{"step": "build_model", "peak_rss_bytes": 400, "rss_bytes": 390,
                "cuda_peak_bytes": null, "estimate_bytes": null}, ...],
     "setup": {"estimate": {"rank0_bytes": 50, "other_bytes": 50},
               "ranks": [{"rank": 0, "rise_bytes": 52,
                          "steps": [{"step": "setup_env", "peak_rss_bytes": 300,
                                     "rss_bytes": 290}, ...]}, ...]}}

``estimate_bytes`` is set on the step the estimate describes (the plan's
last); ``setup`` is there when the plan builds an optimizer.
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
        Such as ``'deepspeed:zero2'``.
    peak_bytes : int
    phase : str
        Where the estimate peaks.
    world_size : int
    setup_rank0_bytes, setup_other_bytes : int, optional
        Setup's host memory on rank 0 and on each other rank.
    steps : dict, optional
        What each step allocates (the report row's ``steps``), for the run's page.
    """

    candidate: str
    peak_bytes: int
    phase: str
    world_size: int
    setup_rank0_bytes: int | None = None
    setup_other_bytes: int | None = None
    steps: dict[str, Any] | None = None

    @classmethod
    def from_report(cls, report: dict[str, Any], label: str) -> RunEstimate:
        """The row ``label`` of a ``flexgraph.estimate/1`` report."""
        row = next(r for r in report["candidates"] if r["candidate"] == label)
        setup = row.get("setup") or {}
        return cls(label, int(row["peak_bytes"]), str(row["phase"]), int(report["world_size"]),
                   setup.get("rank0_bytes"), setup.get("other_bytes"), row.get("steps"))

    def as_report(self) -> dict[str, Any]:
        """This estimate as a ``flexgraph.estimate/1`` report of one candidate (the page's)."""
        setup = None if self.setup_rank0_bytes is None else {
            "rank0_bytes": self.setup_rank0_bytes, "other_bytes": self.setup_other_bytes}
        return {"world_size": self.world_size, "candidates": [{
            "candidate": self.candidate, "peak_bytes": self.peak_bytes, "phase": self.phase,
            "setup": setup, "steps": self.steps}]}

    def to_json(self) -> str:
        """This estimate as the launcher hands it to its ranks."""
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


SETUP_ENDS_WITH = "optim_wrapper"
"""Setup ends with the step that provides this; what follows is the training estimate's."""


def _bytes(mib: float | None) -> int | None:
    return None if mib is None else int(mib * _MIB)


class MeasuredPeaks:
    """Executor hook: each step's peak (RSS, and CUDA's allocated peak) as it ends;
    ``setup_by_rank``: every rank's setup steps once setup ends (a collective)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.setup_by_rank: list[list[dict[str, Any]]] | None = None

    def after_step(self, step: Any, context: Any, record: Any) -> None:
        self.steps.append({"step": step.name, "peak_rss_bytes": _bytes(record.peak_rss_mib),
                           "rss_bytes": _bytes(record.rss_mib),
                           "cuda_peak_bytes": _cuda_peak_bytes(), "estimate_bytes": None})
        if SETUP_ENDS_WITH in step.outputs and self.setup_by_rank is None:
            from flexgraph.training.runtime import gathered_from_every_rank

            mine = [{k: s[k] for k in ("step", "peak_rss_bytes", "rss_bytes")}
                    for s in self.steps[:-1]]
            self.setup_by_rank = gathered_from_every_rank(mine)


def _setup(estimate: RunEstimate, by_rank: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Each rank's setup: its steps, and how far its peak RSS rose above the first step's RSS."""
    ranks = []
    for rank, steps in enumerate(by_rank):
        peaks = [s["peak_rss_bytes"] for s in steps[1:] if s["peak_rss_bytes"] is not None]
        start = steps[0]["rss_bytes"] if steps else None
        rise = max(peaks) - start if peaks and start is not None else None
        ranks.append({"rank": rank, "rise_bytes": rise, "steps": steps})
    return {"estimate": {"rank0_bytes": estimate.setup_rank0_bytes,
                         "other_bytes": estimate.setup_other_bytes},
            "ranks": ranks}


def memory_summary(estimate: RunEstimate, steps: list[dict[str, Any]], rank: int = 0,
                   setup_by_rank: list[list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The ``flexgraph.run-memory/1`` object for a finished run's ``steps``.

    Parameters
    ----------
    estimate : RunEstimate
    steps : list of dict
        The measured peaks of the run's steps.
    rank : int, default 0
    setup_by_rank : list of list of dict, optional
        :attr:`MeasuredPeaks.setup_by_rank`.

    Returns
    -------
    dict
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
    summary = {
        "schema": SCHEMA,
        "estimate": {**asdict(estimate), "step": trains},
        "measured": {"source": source, "peak_bytes": peak, "comparable": comparable,
                     "ratio": round(peak / estimate.peak_bytes, 3) if comparable else None},
        "steps": steps,
    }
    if setup_by_rank is not None:
        summary["setup"] = _setup(estimate, setup_by_rank)
    return summary


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / _MIB:.1f} MiB"


def summary_line(summary: dict[str, Any]) -> str:
    """The console's line for a :func:`memory_summary`, without a newline.

    Parameters
    ----------
    summary : dict

    Returns
    -------
    str
    """
    est, measured = summary["estimate"], summary["measured"]
    line = (f"memory: estimated {_size(est['peak_bytes'])} per rank ({est['candidate']}, "
            f"{est['phase']}), measured {_size(measured['peak_bytes'])} ({measured['source']}")
    line += (f"; ratio {measured['ratio']:.2f})" if measured["ratio"] is not None
             else ": the whole process, no ratio)")
    setup = summary.get("setup")
    if setup and setup["ranks"]:
        first, *rest = setup["ranks"]
        others = max((r["rise_bytes"] or 0 for r in rest), default=None)
        estimated = setup["estimate"]
        line += (f"; setup: estimated {_size(estimated['rank0_bytes'])} on rank 0, "
                 f"{_size(estimated['other_bytes'])} on the others, measured (peak RSS above "
                 f"setup_env's) {_size(first['rise_bytes'])} on rank 0"
                 + (f", at most {_size(others)} on the others" if rest else ""))
    return line
