"""DDPStrategy's memory: every rank the whole model, plus the reducer's gradient buckets.

DistributedDataParallel all-reduces gradients through flat buckets that hold a
copy of every gradient (``gradient_as_bucket_view=False``, torch's default): one
more gradient's worth per rank, allocated when the model is wrapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import refuse_stages
from flexgraph.strategies.names import DDP

from flexgraph.training.estimate import StrategyMemory, replicated_states


def candidate_options(options: Mapping[str, Any], stage: str | None,
                      precision: str | None) -> dict[str, Any]:
    """``ddp[:PRECISION]``: precision is the config's AMP (nothing to set here)."""
    refuse_stages(DDP.name, stage)
    return dict(options)


def estimate_memory(census: Any, *, world_size: int, amp: str | None, optimizer_states: int,
                    model_wrapper: Mapping[str, Any] | None = None) -> StrategyMemory:
    """Replicated model states; buckets as large as the gradients unless they are views."""
    as_view = bool((model_wrapper or {}).get("gradient_as_bucket_view", False))
    buckets = 0 if as_view else census.trainable * 4
    note = ("gradient buckets: views of the gradients (gradient_as_bucket_view)" if as_view
            else "gradient buckets: a copy of every fp32 gradient (modelled)")
    return replicated_states(census, label=DDP.name, amp=amp, optimizer_states=optimizer_states,
                             buffers=buckets, notes=(note,))
