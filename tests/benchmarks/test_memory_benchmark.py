"""benchmarks/memory.py runs end to end in its tiny configuration (no figures are checked).

Only the ``ddp`` row: ``flexgraph run --nproc-per-node 2`` on the benchmark's
MMEngine-style config, then the hand-written DDP script under
``torch.distributed.run``; both must leave a record for each rank, so the
table shows numbers for both instead of a failure note.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import memory  # noqa: E402 (benchmarks/ is not a package)

NUMBERS = r"\s+\d+\s+\d+\s+1\.00$"  # rank 0 MiB, rank 1 MiB, ratio to its own DDP


@pytest.mark.slow
def test_the_ddp_row_runs_end_to_end_in_the_tiny_configuration(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "memory.py"), "--strategies", "ddp",
         "--blocks", "2", "--width", "64", "--warmup", "1", "--iters", "2"],
        env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^\s+flexgraph ddp" + NUMBERS, out, re.M), out
    assert re.search(r"^\s+hand DDP" + NUMBERS, out, re.M), out
    for clock in ("wall", "CPU"):  # s/iter on both sides, and their ratio
        assert re.search(rf"^\s+ddp\s+{clock}\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+\s", out, re.M), out
    assert "2 residual blocks of width 64" in out
    assert list(tmp_path.glob("membench-*")) == []  # work dirs removed without --keep


def test_a_strategy_that_is_not_registered_gives_a_row_saying_so(tmp_path):
    row = memory.Row("zero9", "deepspeed ZeRO-9", dict(type="no_such_strategy"),
                     "_memory_hand_deepspeed.py", "deepspeed.initialize ZeRO-9")
    result = memory.run_flexgraph(row, memory.parse_args([]), tmp_path)
    assert not result.ok
    assert result.note == "not available: no strategy 'no_such_strategy' registered"
    assert "not available: no strategy 'no_such_strategy' registered" in "\n".join(
        memory.memory_table([(result, None)]))
    assert list(tmp_path.iterdir()) == []  # nothing was run


@pytest.mark.slow
def test_estimate_mode_puts_the_estimate_next_to_live_bytes(tmp_path):
    """``--estimate``: the ddp row run with its live tensor bytes counted, and the estimate."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "memory.py"), "--estimate", "--strategies", "ddp",
         "--blocks", "2", "--width", "256"],
        env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = re.search(r"^\s+ddp\s+(\d+)\s+(\d+)\s+(\d+\.\d+)\s+(\d+)\s", done.stdout, re.M)
    assert row, done.stdout
    estimate, live, ratio, rss = (float(v) for v in row.groups())
    assert 0.85 < ratio < 1.15 and live < rss, done.stdout  # 0.92 at this size
