"""Which strategy a command uses when neither the command line nor the spec names one.

``plan`` and ``run`` share this, so that the plan printed is the plan run: a
training config (a cfg.py on the standard training graph) defaults to
``single`` in one process and to ``ddp`` when the world has more than one.
Other specs default to no strategy (their base graph as declared).
"""

from __future__ import annotations

from typing import Any


def default_strategy(spec: Any, world_size: int = 1) -> str | None:
    """The strategy name to use for ``spec`` when none was chosen, or ``None``."""
    if spec.strategy is not None or spec.cfg is None or "steps" in spec.cfg:
        return None
    return "ddp" if world_size > 1 else "single"
