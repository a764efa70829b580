"""Count the instructions a stretch of a Python process executes, under valgrind's callgrind.

``loop_overhead.py --count instructions`` uses it. Timing on a shared CPU
drifts: the loop benchmark's hand loop against itself moves by a few percent
between runs, as much as the overhead it looks for. The instructions a loop
executes do not drift. A process started under
``valgrind --tool=callgrind --instr-atstart=no`` counts nothing until
:meth:`Instructions.at_training` and writes one dump per counted stretch at
:meth:`Instructions.stop`; :func:`slope` turns two dumps into instructions
per iteration. What a count cannot show is where the data lie in memory and
what else runs on the CPU: it complements the timing, it does not replace it.

Threads are counted apart (``--separate-threads``). A thread that wakes on a
timer (a heartbeat every few seconds) does its work per second, not per
iteration, and under callgrind a second holds some fifty times fewer
iterations: counted with the loop, its work would read fifty times its real
cost per iteration. So a stretch's dump holds the thread that asked for it
(the main thread, which runs the loop), and every other thread's count, over
all counted stretches, is in the dumps written at exit
(:func:`background_total`); the loop benchmark turns those into instructions
per second of counted time (:attr:`Instructions.seconds`).

Valgrind's client requests are machine code that its C headers emit, so the
parent compiles a two-function helper library (:func:`build_helper`) that
the children load with ``ctypes``. This module imports nothing heavy, so its
test runs a bare interpreter under callgrind.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import time
from pathlib import Path

HELPER_ENV = "LOOP_OVERHEAD_CALLGRIND"  # the helper library's path, as the children see it
_HELPER_SOURCE = """
#include <valgrind/callgrind.h>
void count_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void count_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS; }
"""
_TOTAL = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)  # a dump's "summary:" line can read 0
MAIN_THREAD = "-01"
"""The suffix callgrind gives the main thread's dumps (valgrind numbers threads from 1)."""


class CallgrindUnavailable(SystemExit):
    """valgrind, a C compiler or valgrind's headers are missing: nothing can be counted."""


def command(dumps: str | Path) -> list[str]:
    """The prefix that runs a process under callgrind, counting only between the requests."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            f"--callgrind-out-file={dumps}"]


def build_helper(folder: str | Path) -> str:
    """Compile the client-request helper into ``folder``; its absolute path (``ctypes``
    looks a bare file name up on the library path, not in the working directory).

    Raises
    ------
    CallgrindUnavailable
        Naming what is missing (valgrind, ``cc``, or ``valgrind/callgrind.h``).
    """
    missing = [tool for tool in ("valgrind", "cc") if shutil.which(tool) is None]
    if missing:
        raise CallgrindUnavailable(f"counting instructions needs valgrind and a C compiler; "
                                   f"missing: {', '.join(missing)}")
    folder = Path(folder).resolve()
    source, helper = folder / "callgrind_helper.c", folder / "callgrind_helper.so"
    source.write_text(_HELPER_SOURCE)
    built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(helper), str(source)],
                           capture_output=True, text=True)
    if built.returncode:
        raise CallgrindUnavailable("cannot compile valgrind's client requests (they need "
                                   f"valgrind/callgrind.h, from valgrind's headers):\n"
                                   f"{built.stderr}")
    return str(helper)


class Instructions:
    """Count from the first iteration of a run (:meth:`at_training`) to its end (:meth:`stop`).

    :meth:`at_training` is the loop benchmark's training barrier, which the
    hand loops call and flexgraph's run reaches through a ``before_train``
    hook; it counts only after :meth:`arm`, so a warm-up run counts nothing.
    """

    def __init__(self, helper: str) -> None:
        self.lib = ctypes.CDLL(helper)
        self.armed = self.counting = False
        self.seconds: list[float] = []
        """The wall seconds of each counted stretch (the other threads count during them)."""
        self._started = 0.0

    def arm(self) -> None:
        self.armed = True

    def at_training(self) -> None:
        if self.armed:
            self.armed, self.counting = False, True
            self._started = time.perf_counter()
            self.lib.count_start()

    def stop(self) -> None:
        """Write this stretch's count (the next dump); a run that never trained is an error."""
        if not self.counting:
            raise RuntimeError("the run never reached its training barrier: nothing was counted")
        self.lib.count_stop()
        self.seconds.append(time.perf_counter() - self._started)
        self.counting = False


def total(dump: str | Path) -> int:
    """The instructions one callgrind dump counted."""
    found = _TOTAL.search(Path(dump).read_text())  # "totals:", the sum over the stretch
    if found is None:
        raise RuntimeError(f"{dump}: no instruction total in callgrind's dump")
    return int(found.group(1))


def slope(dumps: str | Path, extra_iterations: int) -> float:
    """The main thread's instructions per iteration between a process's first two counted
    stretches (``{dumps}.1`` and ``{dumps}.2``), the second ``extra_iterations`` longer."""
    first, second = (total(f"{dumps}.{k}{MAIN_THREAD}") for k in (1, 2))
    return (second - first) / extra_iterations


def background_total(dumps: str | Path) -> int:
    """The instructions every thread but the main one executed in the counted stretches
    (callgrind's dumps at exit, ``{dumps}-NN``; 0 where the process had no other thread)."""
    dumps = Path(dumps)
    others = dumps.parent.glob(f"{dumps.name}-*")
    return sum(total(p) for p in others if not p.name.endswith(MAIN_THREAD))
