"""benchmarks/checkpoint_io.py runs end to end at a tiny size (no figure is checked).

One process, two ranks (``torch.distributed.run``), an async save against
synchronous ones and three conversions, 2 MB in 4 tensors, one round (and
the async save's first, which allocates its buffers): the table must have every row with every
number, and the benchmark must leave nothing behind in its temporary folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NUMBER = r"\d+\.\d+"


def test_the_table_has_every_row_and_number_at_a_tiny_size(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "checkpoint_io.py"), "--size-gb", "0.002",
         "--tensors", "4", "--repeats", "1"],
        env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True,
        timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^checkpoint IO, 0\.00 GB in 4 float32 tensors, median of 1$", out,
                     re.M), out
    for way in ("torch.save \\(no fsync\\) / torch.load", "torch.save \\+ fsync / torch.load",
                "flexgraph FileCheckpointIO", "flexgraph DistributedCheckpointIO"):
        assert re.search(rf"^  {way}\s+" + r"\s+".join([NUMBER] * 7) + "$", out, re.M), out
    assert re.search(rf"^  DCP sharded save \(every rank\)\s+{NUMBER}$", out, re.M), out
    assert re.search(rf"^  gather to rank 0 \+ torch.save\s+{NUMBER}$", out, re.M), out
    assert re.search(rf"^  sharded save speed x gathered: {NUMBER}$", out, re.M), out
    for way in ("portable, async_save=True, first save",
                "portable, async_save=True \\(buffers reused\\)",
                "portable, synchronous \\(DCP fsyncs\\)", "torch.save \\+ fsync"):
        assert re.search(rf"^  {way}\s+{NUMBER}$", out, re.M), out
    assert re.search(rf"^  async blocked x synchronous: {NUMBER}  x torch.save \+ fsync: "
                     rf"{NUMBER}$", out, re.M), out
    assert re.search(rf"^  iterations during the background write: {NUMBER} per save, "
                     rf"median {NUMBER} s vs steady {NUMBER} s \({NUMBER}x\)$", out, re.M), out
    for conversion in ("DCP -> torch", "DCP -> safetensors", "torch -> DCP"):
        assert re.search(rf"^  {conversion}\s+" + r"\s+".join([NUMBER] * 4) + "$", out,
                         re.M), out
    assert list(tmp_path.glob("ckptbench-*")) == [], "its temporary folder is removed"
