"""SingleDeviceStrategy's memory: the whole model, its gradients and optimizer states."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import refuse_stages
from flexgraph.strategies.names import SINGLE

from flexgraph.training.estimate import (
    Allocation,
    SetupMemory,
    StrategyMemory,
    replicated_states,
    whole_model_setup,
    whole_model_steps,
)


def candidate_options(options: Mapping[str, Any], stage: str | None,
                      precision: str | None) -> dict[str, Any]:
    """``single[:PRECISION]``: precision is the config's AMP (nothing to set here)."""
    refuse_stages(SINGLE.name, stage)
    return dict(options)


def estimate_memory(census: Any, *, world_size: int, amp: str | None, optimizer_states: int,
                    device: str | None = None) -> StrategyMemory:
    """Everything on one device; no buffers of its own."""
    return replicated_states(census, label=SINGLE.name, amp=amp,
                             optimizer_states=optimizer_states)


def estimate_setup(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   **_: Any) -> SetupMemory:
    """The whole model, built and initialised on the host."""
    return whole_model_setup(census)


def estimate_steps(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   memory: StrategyMemory, **_: Any) -> tuple[Allocation, ...]:
    """Built whole on the host; ``wrap_model`` moves it to the device."""
    return whole_model_steps(census, memory, target_device)
