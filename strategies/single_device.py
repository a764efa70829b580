"""SingleDeviceStrategy: one process, one device.

The standard graph already is the single-device graph, so this strategy only
binds the device when one is asked for.
"""

from __future__ import annotations

from flexgraph.core.rewrite import Configure
from flexgraph.core.strategy import Strategy


def single_device(device: str | None = None) -> Strategy:
    """Train in this process, on ``device`` (default: CUDA when available, else CPU)."""
    rewrites = [Configure("setup_env", {"device": device})] if device else []
    return Strategy("single", rewrites, doc="one process, one device", world_size="one",
                    memory_model="flexgraph.strategies.single_device_memory",
                    memory_options={"device": device})
