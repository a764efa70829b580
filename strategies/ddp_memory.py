"""DDPStrategy's memory: every rank the whole model, plus the reducer's gradient buckets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.strategies.common import refuse_stages
from flexgraph.strategies.names import DDP

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
    """``ddp[:PRECISION]``: precision is the config's AMP (nothing to set here)."""
    refuse_stages(DDP.name, stage)
    return dict(options)


def _buckets(census: Any, model_wrapper: Mapping[str, Any] | None) -> tuple[int, str]:
    if bool((model_wrapper or {}).get("gradient_as_bucket_view", False)):
        return 0, "gradient buckets: views of the gradients (gradient_as_bucket_view)"
    return census.trainable * 4, "gradient buckets: a copy of every fp32 gradient (modelled)"


def estimate_memory(census: Any, *, world_size: int, amp: str | None, optimizer_states: int,
                    model_wrapper: Mapping[str, Any] | None = None) -> StrategyMemory:
    """Replicated model states; buckets as large as the gradients unless they are views."""
    buckets, note = _buckets(census, model_wrapper)
    return replicated_states(census, label=DDP.name, amp=amp, optimizer_states=optimizer_states,
                             buffers=buckets, notes=(note,))


def estimate_setup(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   model_wrapper: Mapping[str, Any] | None = None) -> SetupMemory:
    """Every rank the whole model; on the CPU, wrapping it adds the gradient buckets."""
    if target_device != "cpu":
        return whole_model_setup(census)
    buckets, note = _buckets(census, model_wrapper)
    return whole_model_setup(census, extra=buckets, notes=(note + ", allocated as it wraps",))


def estimate_steps(census: Any, *, world_size: int, target_device: str, weights_loaded: bool,
                   memory: StrategyMemory, model_wrapper: Mapping[str, Any] | None = None
                   ) -> tuple[Allocation, ...]:
    """Built whole on every rank; wrapping it moves it to the device and adds the buckets."""
    buckets, note = _buckets(census, model_wrapper)
    return whole_model_steps(census, memory, target_device, extra=buckets, extra_what=note)
