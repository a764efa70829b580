"""SingleDeviceStrategy: one process, one device.

The standard graph already is the single-device graph, so this strategy only
binds the device when one is asked for.
"""

from __future__ import annotations

from flexgraph.core.rewrite import Configure
from flexgraph.core.strategy import Strategy


def format_rewrites(checkpoint_format: str) -> list[Configure]:
    """``checkpoint_format='portable'`` for a strategy whose own format is one ``.pth`` file.

    That file stays the default: MMEngine's own tools read it, and every
    flexgraph strategy resumes it (its optimizer state renumbered by name).
    """
    if checkpoint_format == "native":
        return []
    return [Configure("build_checkpointer", {"checkpoint_format": checkpoint_format})]


def single_device(device: str | None = None, checkpoint_format: str = "native") -> Strategy:
    """Train in this process, on ``device`` (default: CUDA when available, else CPU).

    ``checkpoint_format``: ``'native'`` (default: MMEngine's ``.pth``) or ``'portable'``.
    """
    rewrites = [Configure("setup_env", {"device": device})] if device else []
    rewrites += format_rewrites(checkpoint_format)
    return Strategy("single", rewrites, doc="one process, one device", world_size="one",
                    memory_model="flexgraph.strategies.single_device_memory",
                    memory_options={"device": device})
