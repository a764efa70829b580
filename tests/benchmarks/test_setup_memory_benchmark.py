"""benchmarks/setup_memory.py runs end to end at a small size (no figures are checked).

DDP, FSDP, FSDP with ``load_from``, the hand-written MMEngine-style FSDP2 script
and the hand-written ZeRO-3 set up as DeepSpeed's tutorials do, one round each,
4 CPU processes: every row must give numbers (not a failure note), the first
losses must agree (the same weights in every row), and the goals are printed
with a verdict each.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: peaks (rank 0, others), their ratios, time to the first iteration, its ratio, first
#: forward, first loss
NUMBERS = (r"\s+\d+\.\d\d\s+\d+\.\d\d\s+\d\.\d\d/\d\.\d\d\s+\d+\.\d\s+\d+\.\d\d"
           r"\s+\d+\.\d\s+\d\.\d+$")
VERDICT = re.compile(r": (met|not met|not measured)( \(over: [^)]*\))?$")


@pytest.mark.slow
def test_the_rows_run_end_to_end_at_a_small_size(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "setup_memory.py"), "--size", "1M", "--blocks", "2",
         "--rounds", "1", "--rows", "ddp,fsdp,fsdp-load,mmengine,ds-zero-init",
         "--timeout", "240"],
        env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for label in ("flexgraph DDP", "flexgraph FSDP", "flexgraph FSDP, load_from",
                  r"hand FSDP2, every rank whole \(MMEngine\)",
                  r"hand ZeRO-3, zero\.Init \+ gathered init \(DeepSpeed\)"):
        assert re.search(rf"^{label}" + NUMBERS, out, re.M), out
    assert re.search(r"^flexgraph DDP\s+\S+\s+\S+\s+1\.00/1\.00", out, re.M), out
    assert "first iteration's fp32 loss equal to DDP's on every rank, in every row: met" in out
    goals = [line for line in out.splitlines() if line.startswith("goal: ")]
    assert len(goals) == 5 and all(VERDICT.search(line) for line in goals), out
    assert list(tmp_path.glob("setupbench-*")) == []  # work dirs removed without --keep


def _cgroups_unwritable() -> str | None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from _memory_limit import why_not

        return why_not()
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.slow
def test_under_a_limit_smaller_than_the_model_fsdp_gets_through_and_whole_ranks_are_killed(
        tmp_path):
    """Each rank in its own memory cgroup, allowed 0.9x the model's bytes past its imports:
    flexgraph FSDP (2 ranks) reaches the first iteration, DDP and the MMEngine-way and
    Accelerate-way scripts, whose ranks hold the model whole, are killed by the limit."""
    why = _cgroups_unwritable()
    if why:
        pytest.skip(f"memory cgroups cannot be written here: {why}")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "setup_memory.py"), "--size", "160M", "--blocks",
         "16", "--nproc", "2", "--rounds", "0", "--limit", "0.9",
         "--rows", "ddp,fsdp,mmengine,accelerate", "--timeout", "240"],
        env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^  flexgraph FSDP\s+reached the first iteration", out, re.M), out
    for label in ("flexgraph DDP", r"hand FSDP2, every rank whole \(MMEngine\)",
                  r"hand FSDP2, rank 0 whole \+ broadcasts \(Accelerate\)"):
        # which rank the kernel kills first is a race: one of them is
        assert re.search(rf"^  {label}\s+killed by the limit \(rank \d", out, re.M), out
    assert "DDP and the MMEngine-way and Accelerate-way scripts are killed: met" in out
    assert list(tmp_path.glob("setupbench-*")) == []
    assert not list(Path("/sys/fs/cgroup").glob("**/setup-memory-*-rank*"))  # removed
