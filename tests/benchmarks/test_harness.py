"""benchmarks/_harness.py: rounds alternate their order, warm-up rounds do not count, ratios
are taken within a round; and checkpoint_io.py's bare save cannot read slower than its
fsync'ed one (it is the same save, timed up to the fsync)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _harness  # noqa: E402 (benchmarks/ is not a package)
import checkpoint_io  # noqa: E402


def test_rounds_alternate_their_order_and_the_warm_up_is_not_counted():
    calls: list[str] = []
    values = iter(range(1, 100))

    def way(name: str):
        def once() -> float:
            calls.append(name)
            return float(next(values))
        return once

    rounds = _harness.interleave({"base": way("base"), "new": way("new")}, rounds=3,
                                 warmup=1, between=lambda: calls.append("|"))
    assert calls == ["|", "base", "|", "new", "|", "new", "|", "base",
                     "|", "base", "|", "new", "|", "new", "|", "base"]
    # round 0 (1, 2) warmed up; then (new 3, base 4), (base 5, new 6), (new 7, base 8)
    assert rounds.series("base") == [4.0, 5.0, 8.0]
    assert rounds.series("new") == [3.0, 6.0, 7.0]
    assert rounds.ratios("new", "base") == [0.75, 6 / 5, 7 / 8]
    assert rounds.ratio("new", "base") == (pytest.approx(7 / 8), 0.75, 1.2)
    assert format(rounds.of("base"), ".1f") == "median 5.0 (min 4.0, max 8.0)"


def test_a_measurement_holds_named_figures_and_a_number_is_every_figure():
    rounds = _harness.Rounds()
    rounds.add({"a": _harness.Clocks(wall=2.0, cpu=1.0), "b": {"cpu": 4.0}, "c": 8.0})
    assert rounds.series("a", "cpu") == [1.0] and rounds.series("b", "cpu") == [4.0]
    assert rounds.ratios("b", "a", "cpu") == [4.0] and rounds.series("c", "cpu") == [8.0]
    with pytest.raises(ValueError, match="no round"):
        _harness.Rounds(["x"]).of("x")


def test_the_bare_torch_save_is_the_fsynced_one_up_to_its_fsync(tmp_path):
    args = argparse.Namespace(size_gb=0.002, tensors=4, repeats=3)
    threads = torch.get_num_threads()
    try:
        rounds = checkpoint_io.one_process(args, tmp_path)
    finally:
        torch.set_num_threads(threads)
    bare = rounds.series(checkpoint_io.BARE, "save")
    synced = rounds.series(checkpoint_io.BASELINE, "save")
    assert len(bare) == 3 and all(b <= s for b, s in zip(bare, synced, strict=True))
    assert rounds.series(checkpoint_io.BARE, "load") == rounds.series(checkpoint_io.BASELINE,
                                                                      "load")
    assert list(tmp_path.iterdir()) == []  # every round's files are gone
