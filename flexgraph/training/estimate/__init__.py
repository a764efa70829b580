"""Will it fit? Per-rank memory estimates of a training config under candidate strategies.

Nothing is allocated: the model is built on the meta device, one training step is
traced there, and each strategy's memory model (``Strategy.memory_model``) says what it
keeps per rank and what setup holds on the host.
"""

from flexgraph.training.estimate._auto import AUTO_MARGIN, auto_candidates, choose_strategy
from flexgraph.training.estimate._candidates import (
    Candidate,
    parse_candidate,
    parse_candidates,
)
from flexgraph.training.estimate._config import amp_precision
from flexgraph.training.estimate._device import device_memory, host_memory, target_device
from flexgraph.training.estimate._estimate import estimate
from flexgraph.training.estimate._parts import (
    Allocation,
    CandidateError,
    SetupMemory,
    StrategyMemory,
    bytes_per,
    replicated_states,
    trains_on,
    whole_model_setup,
    whole_model_steps,
)

__all__ = [
    "AUTO_MARGIN",
    "Allocation",
    "Candidate",
    "CandidateError",
    "SetupMemory",
    "StrategyMemory",
    "amp_precision",
    "auto_candidates",
    "bytes_per",
    "choose_strategy",
    "device_memory",
    "estimate",
    "host_memory",
    "parse_candidate",
    "parse_candidates",
    "replicated_states",
    "target_device",
    "trains_on",
    "whole_model_setup",
    "whole_model_steps",
]
