"""``memory.json``'s summary: which measure it compares with the estimate, and when."""

from __future__ import annotations

from flexgraph.training.output import RunEstimate, memory_summary, summary_line

ESTIMATE = RunEstimate(candidate="ddp", peak_bytes=1000, phase="backward", world_size=2)


def _step(name: str, rss: int, cuda: int | None) -> dict:
    return {"step": name, "peak_rss_bytes": rss, "cuda_peak_bytes": cuda, "estimate_bytes": None}


def test_cuda_allocated_peak_is_compared_with_the_estimate() -> None:
    summary = memory_summary(ESTIMATE, [_step("setup", 5000, 300), _step("train", 9000, 1100)])
    assert summary["measured"] == {"source": "torch.cuda.max_memory_allocated of rank 0",
                                   "peak_bytes": 1100, "comparable": True, "ratio": 1.1}
    assert [s["estimate_bytes"] for s in summary["steps"]] == [None, 1000]
    assert "ratio 1.10" in summary_line(summary)


def test_without_cuda_the_rss_is_shown_without_a_ratio() -> None:
    summary = memory_summary(ESTIMATE, [_step("setup", 5000, None), _step("train", 9000, None)],
                             rank=0)
    assert summary["measured"]["peak_bytes"] == 9000 and summary["measured"]["ratio"] is None
    assert "no ratio" in summary_line(summary) and "ratio 1" not in summary_line(summary)


def test_the_estimate_travels_to_the_ranks_unchanged() -> None:
    from flexgraph.training.output import RUN_ESTIMATE_VAR, LaunchEnv

    handed = LaunchEnv.read({RUN_ESTIMATE_VAR: ESTIMATE.to_json()})
    assert RunEstimate.from_json(handed.run_estimate) == ESTIMATE
    assert RunEstimate.from_json(LaunchEnv.read({}).run_estimate) is None
