"""benchmarks/_callgrind.py: a count covers the armed stretch alone, and grows with its work.

A bare interpreter runs under real callgrind (a few seconds): the startup and
an unarmed warm-up must count nothing, and three stretches of 1,000, 3,000
and 5,000 iterations must give the same instructions per iteration, which
they do only if each dump holds its own stretch and nothing else. A thread
that wakes on a timer beside them is counted apart, over the counted
stretches only.
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
    import os, sys, threading, time
    sys.path.insert(0, {benchmarks!r})
    import _callgrind

    def work(n):
        return sum(i * i for i in range(n))

    def timer(wakes):
        while True:  # a heartbeat: its work per second, whatever the main thread does
            time.sleep(0.05)
            before = counter.counting
            work(20_000)
            wakes.append((before, counter.counting))

    counter = _callgrind.Instructions(os.environ[_callgrind.HELPER_ENV])
    wakes = []
    if {timer!r}:
        threading.Thread(target=timer, args=(wakes,), daemon=True).start()
    counter.at_training()  # not armed: the warm-up counts nothing
    work(100_000)
    time.sleep(0.5)
    for n in (1_000, 3_000, 5_000):
        counter.arm()
        counter.at_training()
        work(n)
        time.sleep(0.3)
        counter.stop()
    time.sleep(0.5)
    inside = sum(a and b for a, b in wakes)  # wholly within a counted stretch
    touching = sum(a or b for a, b in wakes)  # at least partly within one
    print(inside, touching, len(wakes))
""")


def _count(tmp_path: Path, timer: bool) -> tuple[Path, str]:
    helper = _callgrind.build_helper(tmp_path)
    child = tmp_path / "child.py"
    child.write_text(_CHILD.format(benchmarks=str(BENCHMARKS), timer=timer))
    dumps = tmp_path / "counts"
    done = subprocess.run([*_callgrind.command(dumps), sys.executable, str(child)], check=True,
                          env={**os.environ, _callgrind.HELPER_ENV: helper},
                          capture_output=True, text=True, timeout=300)
    return dumps, done.stdout


@pytest.mark.parametrize("timer", [False, True], ids=["alone", "beside-a-timer"])
def test_each_dump_counts_its_own_stretch_and_nothing_else(tmp_path, timer):
    dumps, _ = _count(tmp_path, timer)
    first, second, third = (_callgrind.total(f"{dumps}.{k}{_callgrind.MAIN_THREAD}")
                            for k in (1, 2, 3))
    per_iteration = _callgrind.slope(dumps, 2_000)
    assert per_iteration > 0
    assert (third - second) / 2_000 == pytest.approx(per_iteration, rel=0.02)
    # The first stretch is its 1,000 iterations and a little more, not the interpreter's
    # startup (tens of millions of instructions) nor the 100,000-iteration warm-up; nor
    # the timer thread's work (20,000 iterations a wake).
    assert first < 3 * 1_000 * per_iteration


def test_a_timer_thread_is_counted_apart_over_the_counted_stretches(tmp_path):
    dumps, printed = _count(tmp_path, timer=True)
    inside, touching, wakes = map(int, printed.split())
    assert inside > 0 and touching < wakes  # it also woke while nothing was counted
    wake = 20_000 * _callgrind.slope(dumps, 2_000)  # a wake's work, as the main thread's
    assert 0.9 * inside * wake <= _callgrind.background_total(dumps) <= 1.1 * touching * wake


def test_stopping_a_run_that_never_trained_is_an_error(tmp_path):
    counter = _callgrind.Instructions(_callgrind.build_helper(tmp_path))
    counter.arm()  # armed, but the run never reached its training barrier
    with pytest.raises(RuntimeError, match="never reached its training barrier"):
        counter.stop()
