"""SingleDeviceStrategy's memory: the whole model, its gradients and optimizer states."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.training.estimate import CandidateError, StrategyMemory, replicated_states


def candidate_options(options: Mapping[str, Any], stage: str | None,
                      precision: str | None) -> dict[str, Any]:
    """``single[:PRECISION]``: precision is the config's AMP (nothing to set here)."""
    if stage is not None:
        raise CandidateError(f"candidate single:{stage}: single has no stages; write "
                             f"single[:fp16|:bf16]")
    return dict(options)


def estimate_memory(census: Any, *, world_size: int, amp: str | None, optimizer_states: int,
                    device: str | None = None) -> StrategyMemory:
    """Everything on one device; no buffers of its own."""
    return replicated_states(census, label="single", amp=amp,
                             optimizer_states=optimizer_states)
