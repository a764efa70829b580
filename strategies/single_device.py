"""SingleDeviceStrategy: one process, one device.

The standard graph already is the single-device graph, so this strategy only
binds the device when one is asked for.
"""

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
        The device to train on.
    checkpoint_format : {'native', 'portable'}, default 'native'
        ``'native'``: MMEngine's ``.pth``; ``'portable'``: by parameter name,
        resumable under every strategy.

    Returns
    -------
    Strategy
        ``single``: the base graph, configured.
    """
    rewrites = [Configure("setup_env", {"device": device})] if device else []
    rewrites += format_rewrites(checkpoint_format)
    return Strategy(SINGLE.name, rewrites, doc="one process, one device", world_size="one",
                    memory_model=SINGLE.memory_model, memory_options={"device": device})
