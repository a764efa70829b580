"""The estimate: a model census, one traced step per compute mode, each candidate's peak.

Per rank, for each candidate strategy::

    peak = parameters + optimizer states
           + max(activations + gradients so far + buffers    (forward / backward),
                 gradients + the step's temporaries + buffers (optimizer step))

Parameters, gradients and optimizer states come from the strategy's memory
model (exact counts times bytes, sharded as the strategy shards them); its
buffers (DDP's gradient buckets, FSDP's all-gathered units, DeepSpeed's
buckets) are modelled from its options and marked so; activations are
counted on the traced step, at its peak (the gradients alive then are the
trace's share of the strategy's gradients). A strategy may keep fewer
gradients and buffers through the optimizer step than at the end of backward
(``StrategyMemory.step_gradients``, ``step_buffers``). The optimizer step's temporaries
(torch's Adam and AdamW, :func:`step_temporaries`) are modelled from the
tensors the strategy has the optimizer step on, and counted with the optimizer
when the step is the peak.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from ._candidates import Candidate, memory_module
from ._census import Census, take_census
from ._config import first_batch, optimizer_states, step_temporaries
from ._device import target_device
from ._parts import StrategyMemory
from ._trace import StepTrace, UntraceableModelError, trace_step

__all__ = ["SCHEMA", "CandidateEstimate", "Estimate", "build_meta_model", "estimate"]

SCHEMA = "flexgraph.estimate/1"
PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers")


@attrs.frozen
class CandidateEstimate:
    """One candidate's per-rank peak, its parts and where it is reached.

    Parameters
    ----------
    label : str
        The candidate as written.
    strategy : str
        Its strategy's name.
    memory : StrategyMemory
        The strategy's per-rank model states and buffers.
    trace : StepTrace or None
        The traced step (``None``: the step could not be traced).
    world_size : int
        The ranks the estimate is for.
    step_temporaries : int, default 0
        Bytes the optimizer's step allocates besides its states.
    step_note : str, optional
        What the step's temporaries assume, one line.
    """

    label: str
    strategy: str
    memory: StrategyMemory
    trace: StepTrace | None
    world_size: int
    step_temporaries: int = 0
    step_note: str | None = None

    @property
    def parts(self) -> dict[str, int | None]:
        m, t = self.memory, self.trace
        optimizer = m.optimizer
        if t is not None and self._step_phase_wins:
            activations = t.activations
            grads = m.gradients * t.grads_at_peak // max(t.grads, 1)
            buffers = m.buffers
        else:  # the optimizer step (or no trace: the step is all that is known)
            activations = None if t is None else 0
            grads = self._step_gradients
            optimizer += self.step_temporaries
            buffers = self._step_buffers
        return {"parameters": m.parameters, "gradients": grads, "optimizer": optimizer,
                "activations": activations, "buffers": buffers}

    @property
    def _step_gradients(self) -> int:
        m = self.memory
        return m.gradients if m.step_gradients is None else m.step_gradients

    @property
    def _step_buffers(self) -> int:
        m = self.memory
        return m.buffers if m.step_buffers is None else m.step_buffers

    @property
    def _step_phase_wins(self) -> bool:
        """Whether forward / backward (the traced step) reach higher than the optimizer step."""
        t, m = self.trace, self.memory
        if t is None:
            return False
        during = t.activations + m.gradients * t.grads_at_peak // max(t.grads, 1) + m.buffers
        return during >= self._step_gradients + self.step_temporaries + self._step_buffers

    @property
    def peak(self) -> int:
        return sum(v or 0 for v in self.parts.values())

    @property
    def phase(self) -> str:
        if self.trace is None:
            return "optimizer step (activations not traced)"
        if not self._step_phase_wins:
            return "optimizer step"
        where = f" ({self.trace.module})" if self.trace.module else ""
        return f"{self.trace.phase}{where}"


@attrs.frozen
class Estimate:
    """Every candidate's estimate for one config, and what they share.

    Parameters
    ----------
    census : Census
        The model's parameter counts.
    candidates : tuple of CandidateEstimate
        One estimate per candidate, in the order given.
    world_size : int
        The ranks the estimate is for.
    batch_size : int or None
        The traced batch's size per rank.
    optimizer : str
        The optimizer's name (its states per parameter follow from it).
    untraceable : str, optional
        Why the step could not be traced, when it could not.
    seconds : float, default 0.0
        How long the estimate took.
    """

    census: Census
    candidates: tuple[CandidateEstimate, ...]
    world_size: int
    batch_size: int | None
    optimizer: str
    untraceable: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The ``flexgraph.estimate/1`` JSON object (bytes as integers)."""
        return {
            "schema": SCHEMA,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "parameters": self.census.as_dict(),
            "untraceable": self.untraceable,
            "candidates": [{
                "candidate": c.label,
                "strategy": c.strategy,
                "compute": c.memory.compute,
                "peak_bytes": c.peak,
                "phase": c.phase,
                "parts": c.parts,
                "traced_activations_bytes": c.trace.activations if c.trace else None,
                "step_temporaries_bytes": c.step_temporaries,
                "modelled": list(c.memory.modelled),
                "notes": [*c.memory.notes, *([c.step_note] if c.step_note else [])],
                "reference_bytes": c.memory.reference,
            } for c in self.candidates],
            "seconds": round(self.seconds, 3),
        }


def build_meta_model(cfg: Any) -> torch.nn.Module:
    """``cfg.model`` built on the meta device: every tensor without storage.

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config.

    Returns
    -------
    torch.nn.Module
        The model in train mode, its tensors on the meta device.

    Raises
    ------
    ConfigError
        The config has no buildable ``model``.
    """
    from flexgraph.training.components import build_model_from_cfg

    with torch.device("meta"):
        model = build_model_from_cfg(cfg, env=None)
    return model.train()


def _batch_size(cfg: Any) -> int | None:
    loader = cfg.get("train_dataloader") if cfg is not None else None
    return loader.get("batch_size") if hasattr(loader, "get") else None


def estimate(cfg: Any, candidates: Sequence[Candidate], *, world_size: int,
             device: str | None = None) -> Estimate:
    """Estimate each candidate's per-rank peak for ``cfg`` on ``world_size`` ranks.

    The model is built once (meta device), the first batch loaded once, and
    the step traced once per compute mode the candidates need. ``device``
    (``'cuda'`` or ``'cpu'``; ``None``: this machine's, as :func:`target_device`
    says): where the run would train, which decides the optimizer kernels
    torch picks by default (:func:`step_temporaries`).

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config.
    candidates : sequence of Candidate
        The strategies to estimate (:func:`parse_candidates`).
    world_size : int
        The ranks the run would have.
    device : str, optional
        ``'cuda'`` or ``'cpu'``; ``None``: this machine's (:func:`target_device`).

    Returns
    -------
    Estimate
        Every candidate's per-rank peak, its parts and where it is reached.

    Raises
    ------
    CandidateError
        A candidate whose strategy has no memory model.
    """
    start = time.perf_counter()
    device = device or target_device(None)
    model = build_meta_model(cfg)
    census = take_census(model)
    states, optimizer_name = optimizer_states(cfg)
    memories, models = [], []
    for candidate in candidates:
        module = memory_module(candidate.strategy)
        options = dict(candidate.strategy.memory_options)
        memories.append(module.estimate_memory(
            census, world_size=world_size, amp=candidate.amp, optimizer_states=states,
            **options))
        models.append(_traced_model(module, cfg, options))
    traces: dict[tuple[str, str], StepTrace] = {}
    untraceable = None
    batch = first_batch(cfg)
    memo: dict[Any, Any] = {}
    for memory, (key, own_model) in zip(memories, models, strict=True):
        if (memory.compute, key) in traces or untraceable:
            continue
        try:
            traces[memory.compute, key] = trace_step(own_model or model, batch, memory.compute,
                                                     memo)
        except UntraceableModelError as exc:
            untraceable = str(exc)
    rows = tuple(CandidateEstimate(label=c.label, strategy=c.strategy.name, memory=m,
                                   trace=traces.get((m.compute, key)), world_size=world_size,
                                   **_step_of(cfg, m, device))
                 for c, m, (key, _) in zip(candidates, memories, models, strict=True))
    return Estimate(census=census, candidates=rows, world_size=world_size,
                    batch_size=_batch_size(cfg), optimizer=optimizer_name,
                    untraceable=untraceable, seconds=time.perf_counter() - start)


def _step_of(cfg: Any, memory: StrategyMemory, device: str) -> dict[str, Any]:
    temporaries, note = step_temporaries(cfg, memory.stepped, device)
    return {"step_temporaries": temporaries, "step_note": note}


def _traced_model(module: Any, cfg: Any, options: dict[str, Any]
                  ) -> tuple[str, torch.nn.Module | None]:
    """(a key for its trace, the model as the strategy changes it) or ``("", None)``: the
    shared model (see the memory modules' ``traced_model`` in ``_parts``)."""
    change = getattr(module, "traced_model", None)
    if change is None:
        return "", None
    changed = change(build_meta_model(cfg), **options)
    if changed is None:
        return "", None
    return f"{module.__name__}:{sorted(options.items())!r}", changed
