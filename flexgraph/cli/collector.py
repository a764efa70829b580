"""Python's garbage collector kept off what a run's imports create.

A run imports torch, mmengine, its config's modules and flexgraph: hundreds of
thousands of objects that live as long as the process, which every full
collection would scan again. So ``flexgraph run`` and ``flexgraph plan
--estimate/--compare`` pause the collector while they load the config and
import the plan's functions, then freeze what exists (``gc.freeze``) and
resume it; the frozen objects go back to the collector when the block ends.
Its measured benefit is in ``docs/benchmarks/startup.rst``.
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
