"""Python's garbage collector kept off what a run's imports create.

A run imports torch, mmengine, its config's modules and flexgraph: about
330,000 objects (modules, classes, functions) that live as long as the process.
Python's collector scans every one of them in each full collection, and it
starts one each time the objects that survived younger collections grow by a
quarter. On the benchmarks' tiny workload such a collection cost 130 ms in the
middle of a run's imports and 184 ms in the middle of training.

So ``flexgraph run`` pauses the collector while it loads the config, plans
and imports the plan's step functions, then freezes everything that exists
(``gc.freeze``: moved to a generation no collection scans) and resumes the
collector before the first step. What the steps create (models, checkpoints,
optimizer state, batches) is collected as usual. When the run ends the frozen
objects go back to the collector (``gc.unfreeze``), so a process that runs
several configs (a test session, a notebook) keeps nothing for good. The
price: reference cycles that became garbage while loading stay until the run
ends (the imports' leftovers, mostly tuples, cells and functions: 8,800 to
9,300 objects, 1.0 to 1.6 MB, on the benchmarks' and the quickstart's configs).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

__all__ = ["imports_kept_from_collector"]


@contextlib.contextmanager
def imports_kept_from_collector() -> Iterator[Callable[[], None]]:
    """Pause the collector; the callable it yields freezes what exists and resumes it.

    Call the callable once the imports are done (before objects worth
    collecting appear). On exit the frozen objects are handed back and the
    collector is left as it was found, whether or not the callable was called.
    """
    was_enabled = gc.isenabled()
    gc.disable()

    def imports_done() -> None:
        gc.freeze()  # before enabling: the next allocation would collect them all otherwise
        if was_enabled:
            gc.enable()

    try:
        yield imports_done
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
