"""Will it fit? Per-rank memory estimates of a training config under candidate strategies.

Nothing is allocated: the model is built on the meta device, one training step
is traced there, and each strategy's memory model (``Strategy.memory_model``, see
:mod:`._parts`) says what it keeps per rank, and what setup holds on the host.
``flexgraph plan --estimate / --compare / --strategy auto`` show it.
"""

from flexgraph.training.estimate._auto import (
    AUTO_MARGIN,
    AUTO_ORDER,
    AutoChoice,
    NothingFitsError,
    auto_candidates,
    choose_strategy,
    setup_refusal,
)
from flexgraph.training.estimate._candidates import (
    PRECISIONS,
    Candidate,
    parse_candidate,
    parse_candidates,
)
from flexgraph.training.estimate._census import Census, take_census
from flexgraph.training.estimate._config import amp_precision, optimizer_states
from flexgraph.training.estimate._device import (
    DeviceMemoryError,
    device_memory,
    host_memory,
    parse_size,
    target_device,
)
from flexgraph.training.estimate._estimate import (
    PARTS,
    SCHEMA,
    CandidateEstimate,
    Estimate,
    build_meta_model,
    estimate,
)
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
from flexgraph.training.estimate._trace import StepTrace, UntraceableModelError, trace_step

__all__ = [
    "AUTO_MARGIN",
    "AUTO_ORDER",
    "Allocation",
    "PARTS",
    "PRECISIONS",
    "SCHEMA",
    "AutoChoice",
    "Candidate",
    "CandidateError",
    "CandidateEstimate",
    "Census",
    "DeviceMemoryError",
    "Estimate",
    "NothingFitsError",
    "SetupMemory",
    "StepTrace",
    "StrategyMemory",
    "UntraceableModelError",
    "amp_precision",
    "auto_candidates",
    "build_meta_model",
    "bytes_per",
    "choose_strategy",
    "device_memory",
    "estimate",
    "host_memory",
    "optimizer_states",
    "parse_candidate",
    "parse_candidates",
    "parse_size",
    "replicated_states",
    "setup_refusal",
    "take_census",
    "target_device",
    "trace_step",
    "trains_on",
    "whole_model_setup",
    "whole_model_steps",
]
