"""The estimate: a model census, one traced step per compute mode, each candidate's peak.

Per rank, for each candidate strategy::

    peak = parameters + optimizer states
           + max(activations + gradients so far + buffers    (forward / backward),
                 gradients + the step's temporaries + buffers (optimizer step))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from ._candidates import Candidate, memory_module
from ._census import Census, take_census
from ._config import first_batch, optimizer_states, step_temporaries
from ._device import target_device
from ._parts import (
    Allocation,
    SetupMemory,
    StrategyMemory,
    trains_on,
    whole_model_setup,
    whole_model_steps,
)
from ._trace import StepTrace, UntraceableModelError, trace_step

SCHEMA = "flexgraph.estimate/1"


@attrs.frozen
class CandidateEstimate:
    """One candidate's per-rank peak, its parts and where it is reached (``trace=None``: the
    step could not be traced)."""

    label: str
    strategy: str
    memory: StrategyMemory
    trace: StepTrace | None
    world_size: int
    step_temporaries: int = 0
    step_note: str | None = None
    setup: SetupMemory | None = None
    steps: tuple[Allocation, ...] = ()
    trains_on: str = "device"

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
        """Whether forward / backward reach higher than the optimizer step."""
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
    """Every candidate's estimate for one config, and what they share (``untraceable``: why
    the step could not be traced)."""

    census: Census
    candidates: tuple[CandidateEstimate, ...]
    world_size: int
    batch_size: int | None
    optimizer: str
    untraceable: str | None = None
    seconds: float = 0.0
    weights_loaded: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The ``flexgraph.estimate/1`` JSON object (bytes as integers)."""
        return {
            "schema": SCHEMA,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "parameters": self.census.as_dict(),
            "untraceable": self.untraceable,
            "weights_loaded": self.weights_loaded,
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
                "setup": None if c.setup is None else {
                    "rank0_bytes": c.setup.rank0, "other_bytes": c.setup.others,
                    "notes": list(c.setup.notes)},
                "steps": {"trains_on": c.trains_on,
                          "allocations": [a.as_dict() for a in c.steps]},
            } for c in self.candidates],
            "seconds": round(self.seconds, 3),
        }


def build_meta_model(cfg: Any) -> torch.nn.Module:
    """``cfg.model`` built on the meta device, in train mode."""
    from flexgraph.training.components import build_model_from_cfg

    with torch.device("meta"):
        model = build_model_from_cfg(cfg, env=None)
    return model.train()


def _batch_size(cfg: Any) -> int | None:
    loader = cfg.get("train_dataloader") if cfg is not None else None
    return loader.get("batch_size") if hasattr(loader, "get") else None


def estimate(cfg: Any, candidates: Sequence[Candidate], *, world_size: int,
             device: str | None = None, weights_loaded: bool = False) -> Estimate:
    """Estimate each candidate's per-rank peak for ``cfg`` on ``world_size`` ranks.

    The step is traced once per compute mode the candidates need.

    Parameters
    ----------
    cfg, candidates, world_size
    device : str, optional
        ``'cuda'`` or ``'cpu'`` (``None``: this machine's): it decides the
        optimizer kernels and what setup holds on the host.
    weights_loaded : bool, default False
        The files set every weight, so ``init_weights`` may be pruned.

    Returns
    -------
    Estimate

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
    memories, models, setups, steps = [], [], [], []
    whole = None  # recorded once, for the first candidate that needs it
    for candidate in candidates:
        module = memory_module(candidate.strategy)
        options = dict(candidate.strategy.memory_options)
        memories.append(module.estimate_memory(
            census, world_size=world_size, amp=candidate.amp, optimizer_states=states,
            **options))
        models.append(_traced_model(module, cfg, options))
        facts = {"world_size": world_size, "target_device": device, "weights_loaded":
                 weights_loaded and "init_weights" in candidate.strategy.prunable}
        setups.append(_setup_of(module, census, options, **facts))
        steps.append(_steps_of(module, census, options, memory=memories[-1], **facts))
        if not facts["weights_loaded"] and _replays_init(candidate.strategy):
            whole = initialised_whole(cfg, census) if whole is None else whole
            setups[-1], steps[-1] = _with_whole(setups[-1], steps[-1], whole)
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
                                   setup=setup, steps=placed, trains_on=trains_on(device),
                                   **_step_of(cfg, m, device))
                 for c, m, (key, _), setup, placed in zip(candidates, memories, models,
                                                          setups, steps, strict=True))
    return Estimate(census=census, candidates=rows, world_size=world_size,
                    batch_size=_batch_size(cfg), optimizer=optimizer_name,
                    untraceable=untraceable, seconds=time.perf_counter() - start,
                    weights_loaded=weights_loaded)


def _replays_init(strategy: Any) -> bool:
    steps = [getattr(getattr(r, "rewrite", r), "step", None) for r in strategy.rewrites]
    return any(str(getattr(s, "fn", "")).endswith(":init_from_record") for s in steps)


def initialised_whole(cfg: Any, census: Census) -> tuple[tuple[str, int, str], ...]:
    """``(name, parameter bytes, why)`` of the modules rank 0 initialises whole and sends:
    those whose ``init_weights`` the one-device record cannot follow."""
    from flexgraph.training.components import record_one_device_setup
    from flexgraph.training.runtime import capture_rng, restore_rng

    before = capture_rng()
    logging.disable(logging.INFO)  # init_weights' per-parameter lines go to stdout, past --format
    try:
        record = record_one_device_setup(cfg, None, load_pretrained=lambda *_: None)
    finally:
        logging.disable(logging.NOTSET)
        restore_rng(before)
    modules = dict(census.model.named_modules())
    return tuple((name, sum(p.numel() * p.element_size() for p in modules[name].parameters()),
                  why) for name, why in zip(record.whole, record.reasons, strict=True))


def _with_whole(setup: SetupMemory, steps: tuple[Allocation, ...],
                whole: tuple[tuple[str, int, str], ...]
                ) -> tuple[SetupMemory, tuple[Allocation, ...]]:
    held = sum(size for _, size, _ in whole)
    notes = tuple(f"init_weights: {name or 'the model'} cannot be made from the one-device "
                  f"record ({why}); it alone is initialised whole on rank 0 and sent"
                  for name, _, why in whole)
    if not whole:
        return setup, steps
    return (attrs.evolve(setup, rank0=setup.rank0 + held, notes=(*setup.notes, *notes)),
            (*steps, Allocation("init_weights", held, "the modules initialised whole",
                                ranks="rank0", transient=True)))


def _setup_of(module: Any, census: Census, options: dict[str, Any], **facts: Any
              ) -> SetupMemory:
    setup = getattr(module, "estimate_setup", None)
    if setup is None:
        return whole_model_setup(census, notes=(f"{module.__name__} does not say what its "
                                                f"setup holds",))
    return setup(census, **facts, **options)


def _steps_of(module: Any, census: Census, options: dict[str, Any], *,
              memory: StrategyMemory, **facts: Any) -> tuple[Allocation, ...]:
    steps = getattr(module, "estimate_steps", None)
    if steps is None:
        return whole_model_steps(census, memory, facts["target_device"])
    return tuple(steps(census, memory=memory, **facts, **options))


def _step_of(cfg: Any, memory: StrategyMemory, device: str) -> dict[str, Any]:
    temporaries, note = step_temporaries(cfg, memory.stepped, device)
    return {"step_temporaries": temporaries, "step_note": note}


def _traced_model(module: Any, cfg: Any, options: dict[str, Any]
                  ) -> tuple[str, torch.nn.Module | None]:
    """(a trace key, the model as the strategy changes it), or ``("", None)``: the shared one."""
    change = getattr(module, "traced_model", None)
    if change is None:
        return "", None
    changed = change(build_meta_model(cfg), **options)
    if changed is None:
        return "", None
    return f"{module.__name__}:{sorted(options.items())!r}", changed
