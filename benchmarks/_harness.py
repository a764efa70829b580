"""The benchmarks' one way of timing: interleaved rounds, medians and spreads, ratios per round.

A figure measured once, or measured in a block before its baseline is
measured in another block, tells the order of measurement as much as the
work: whatever the machine does in between (other processes, the page
cache filling, dirty pages written back, a CPU's clock) falls on one side
only. So every benchmark here measures in rounds. In each round every way
(the baseline and the candidates alike) runs once; the order reverses from
one round to the next, so no way always runs first or always follows the
same neighbour; the first round (or rounds) warm up and are not counted;
and a candidate's ratio is taken against the baseline of the same round,
then the median over rounds. A spread (min and max over rounds) comes with
every median, so a reader sees how far the figure is to be trusted.

The API::

    rounds = interleave({"baseline": f, "candidate": g}, rounds=5, warmup=1)
    rounds.of("candidate")                   # Spread of g's measurements
    rounds.ratio("candidate", "baseline")    # Spread of g / f, round by round
    print(f"x {rounds.ratio('candidate', 'baseline')}")  # median 1.02 (min ..., max ...)

A way returns what it measured: seconds (:func:`timed` gives wall and CPU
time as a :class:`Clocks`), or any mapping of named figures; ``key`` picks
one of them. A benchmark whose rounds run elsewhere (the loop benchmark's
pairs of processes) records each round itself with :meth:`Rounds.add` and
orders it with :func:`round_order`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["Clocks", "Rounds", "Spread", "interleave", "round_order", "timed"]


class Clocks(NamedTuple):
    """Seconds of one measurement: wall time, and the process's CPU time (which other
    processes on a shared machine disturb much less)."""

    wall: float
    cpu: float


def timed(work: Callable[[], object]) -> Clocks:
    """The wall and CPU seconds of ``work()``."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return Clocks(time.perf_counter() - wall, time.process_time() - cpu)


class Spread(NamedTuple):
    """A median over rounds, with the smallest and largest value of those rounds."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread of no values: no round was counted")
        return cls(statistics.median(values), min(values), max(values))

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        return f"median {self.median:{spec}} (min {self.min:{spec}}, max {self.max:{spec}})"

    def __str__(self) -> str:
        return format(self)


def round_order(names: Sequence[str], round_: int) -> list[str]:
    """``names`` in their order on even rounds, reversed on odd ones."""
    return list(names) if round_ % 2 == 0 else list(reversed(names))


class Rounds:
    """What each way measured, round by round (counted rounds only)."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.values: dict[str, list[Any]] = {name: [] for name in names}

    def add(self, measured: Mapping[str, Any]) -> None:
        """One round: a measurement for each way."""
        for name, value in measured.items():
            self.values.setdefault(name, []).append(value)

    def series(self, name: str, key: str | int | None = None) -> list[float]:
        """``name``'s value in every round (``key``: which figure of each measurement)."""
        return [value if key is None else _pick(value, key) for value in self.values[name]]

    def of(self, name: str, key: str | int | None = None) -> Spread:
        return Spread.of(self.series(name, key))

    def ratios(self, candidate: str, baseline: str, key: str | int | None = None) -> list[float]:
        """``candidate / baseline`` in each round (both measured in that round)."""
        return [c / b for c, b in zip(self.series(candidate, key), self.series(baseline, key),
                                      strict=True)]

    def ratio(self, candidate: str, baseline: str, key: str | int | None = None) -> Spread:
        return Spread.of(self.ratios(candidate, baseline, key))


def _pick(value: Any, key: str | int) -> float:
    """Figure ``key`` of one measurement; a bare number is every figure of its own."""
    if isinstance(value, (int, float)):
        return value
    return getattr(value, key) if isinstance(key, str) and hasattr(value, key) else value[key]


def interleave(ways: Mapping[str, Callable[[], Any]], rounds: int, *, warmup: int = 1,
               between: Callable[[], object] | None = None) -> Rounds:
    """Run every way once per round, the order reversed every other round.

    Parameters
    ----------
    ways:
        Name -> a callable that does the work once and returns what it
        measured (seconds, :class:`Clocks`, or a mapping of figures).
    rounds:
        Rounds that count.
    warmup:
        Rounds run first, in the same way, and not counted: the first calls
        pay for imports, caches and allocations the later ones find ready.
    between:
        Called (untimed) before each way runs, e.g. to write dirty pages back
        so that no way pays for another's.

    Returns
    -------
    Rounds
        The counted rounds' measurements, by way.
    """
    names = list(ways)
    measured = Rounds(names)
    for round_ in range(warmup + rounds):
        this_round = {}
        for name in round_order(names, round_):
            if between is not None:
                between()
            this_round[name] = ways[name]()
        if round_ >= warmup:
            measured.add(this_round)
    return measured
