"""benchmarks/_callgrind.py: a count covers the armed stretch alone, and grows with its work.

A bare interpreter runs under real callgrind (a few seconds): the startup and
an unarmed warm-up must count nothing, and three stretches of 1,000, 3,000
and 5,000 iterations must give the same instructions per iteration, which
they do only if each dump holds its own stretch and nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _callgrind  # noqa: E402 (benchmarks/ is not a package)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("cc") is None,
    reason="needs valgrind and a C compiler (Debian: apt-get install valgrind gcc)")]

_CHILD = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {benchmarks!r})
    import _callgrind

    def work(n):
        return sum(i * i for i in range(n))

    counter = _callgrind.Instructions(os.environ[_callgrind.HELPER_ENV])
    counter.at_training()  # not armed: the warm-up counts nothing
    work(100_000)
    for n in (1_000, 3_000, 5_000):
        counter.arm()
        counter.at_training()
        work(n)
        counter.stop()
""")


def test_each_dump_counts_its_own_stretch_and_nothing_else(tmp_path):
    helper = _callgrind.build_helper(tmp_path)
    child = tmp_path / "child.py"
    child.write_text(_CHILD.format(benchmarks=str(BENCHMARKS)))
    dumps = tmp_path / "counts"
    subprocess.run([*_callgrind.command(dumps), sys.executable, str(child)], check=True,
                   env={**os.environ, _callgrind.HELPER_ENV: helper}, capture_output=True,
                   timeout=300)
    first, second, third = (_callgrind.total(f"{dumps}.{k}") for k in (1, 2, 3))
    per_iteration = _callgrind.slope(dumps, 2_000)
    assert per_iteration > 0
    assert (third - second) / 2_000 == pytest.approx(per_iteration, rel=0.02)
    # The first stretch is its 1,000 iterations and a little more, not the interpreter's
    # startup (tens of millions of instructions) nor the 100,000-iteration warm-up.
    assert first < 3 * 1_000 * per_iteration


def test_stopping_a_run_that_never_trained_is_an_error(tmp_path):
    counter = _callgrind.Instructions(_callgrind.build_helper(tmp_path))
    counter.arm()  # armed, but the run never reached its training barrier
    with pytest.raises(RuntimeError, match="never reached its training barrier"):
        counter.stop()
