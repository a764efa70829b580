"""What does the training loop's stop check cost per iteration?

To stop cleanly on a signal, ``TrainLoop._iterate`` tests one more thing per
iteration: ``if it >= next_event or stop.pending`` instead of
``if it >= next_event`` (``stop.pending`` is an attribute a single process's
signal handler sets; several ranks agree at scheduled events instead, which
cost nothing in between). This script times both forms of that loop
condition in the same process, in interleaved rounds (``_harness.py``), and
sets the difference against
one iteration of the tiny workload that ``loop_overhead.py`` trains (an MLP
step of about a millisecond on one CPU thread, measured here too)::

    python benchmarks/stop_check.py [--iters N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _tiny  # noqa: E402 (this folder is sys.path[0] when run as a script)
from _harness import interleave  # noqa: E402

from flexgraph.training.loop import StopRequest


def without_check(iters: int, next_event: int) -> float:
    t0 = time.perf_counter()
    it = 0
    for _ in range(iters):
        it += 1  # noqa: SIM113 (the count is kept as TrainLoop._iterate keeps it)
        if it >= next_event:
            break
    return time.perf_counter() - t0


def with_check(iters: int, next_event: int, stop: StopRequest) -> float:
    t0 = time.perf_counter()
    it = 0
    for _ in range(iters):
        it += 1  # noqa: SIM113 (the count is kept as TrainLoop._iterate keeps it)
        if it >= next_event or stop.pending:
            break
    return time.perf_counter() - t0


def tiny_step_seconds(steps: int = 300) -> float:
    """Median time of one training step of the tiny workload (forward, backward, step)."""
    torch.set_num_threads(1)
    model = _tiny.TinyMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _tiny.TinyData(_tiny.BATCH)
    x, y = data.x, data.y
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[steps // 10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    stop = StopRequest()
    never = args.iters + 1
    rounds = interleave({"plain": lambda: without_check(args.iters, never),
                         "checked": lambda: with_check(args.iters, never, stop)},
                        args.repeats)
    base = rounds.of("plain").median / args.iters
    per_iter = rounds.of("checked").median / args.iters - base
    step = tiny_step_seconds()
    print(f"loop condition, median of {args.repeats} x {args.iters:,} iterations:")
    print(f"  it >= next_event                  {base * 1e9:6.1f} ns")
    print(f"  it >= next_event or stop.pending  {(base + per_iter) * 1e9:6.1f} ns")
    print(f"  the stop check adds {per_iter * 1e9:.1f} ns per iteration")
    print(f"tiny workload step: {step * 1e6:.0f} us; the check adds {per_iter / step:.2e} "
          f"of it")


if __name__ == "__main__":
    main()
