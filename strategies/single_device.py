"""SingleDeviceStrategy: one process, one device; the standard graph already is its graph."""

from __future__ import annotations

from flexgraph.strategies.common import format_rewrites
from flexgraph.strategies.names import SINGLE

from flexgraph.core.rewrite import Configure
from flexgraph.core.strategy import Strategy


def single_device(device: str | None = None, checkpoint_format: str = "native") -> Strategy:
    """Train in this process, on ``device`` (default: CUDA when available, else CPU).

    Parameters
    ----------
    device : str, optional
    checkpoint_format : {'native', 'portable'}, default 'native'

    Returns
    -------
    Strategy
    """
    rewrites = [Configure("setup_env", {"device": device})] if device else []
    rewrites += format_rewrites(checkpoint_format)
    return Strategy(SINGLE.name, rewrites, doc="one process, one device", world_size="one",
                    memory_model=SINGLE.memory_model, memory_options={"device": device})
