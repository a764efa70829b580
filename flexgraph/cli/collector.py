"""Python's garbage collector kept off what a run's imports create.

A run imports torch, mmengine and the config's modules: objects that live as
long as the process, which every full collection would scan again. Its
measured benefit is in ``docs/benchmarks/startup.rst``.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def imports_kept_from_collector() -> Iterator[Callable[[], None]]:
    """Pause the collector; the callable it yields freezes what exists and resumes it.

    On exit the frozen objects are handed back and the collector is left as found.
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
