"""``--strategy auto``: the fastest-communicating candidate whose estimate fits.

Candidates are tried in the order of what they communicate per step: one
process needs none (``single``); with several, DDP all-reduces gradients
only, ZeRO-1/2 add a parameter all-gather of optimizer partitions, FSDP and
ZeRO-3 gather parameters in every forward and backward, and offload moves
optimizer states over PCIe. The first whose per-rank peak fits the device
with the margin wins; the plan shows the whole table and the reason.
"""

from __future__ import annotations

import attrs

from flexgraph.training.errors import ConfigError

from ._estimate import CandidateEstimate, Estimate

__all__ = ["AUTO_MARGIN", "AUTO_ORDER", "AutoChoice", "NothingFitsError", "auto_candidates",
           "choose_strategy"]

AUTO_ORDER = ("ddp", "deepspeed:zero1", "deepspeed:zero2", "fsdp", "deepspeed:zero3",
              "deepspeed:zero3-offload")
"""The candidates of several processes, cheapest communication first."""
AUTO_MARGIN = 0.10
"""Share of the device kept free: the allocator's cache, the CUDA context, fragmentation."""

GB = 1e9


def _size(nbytes: float) -> str:
    """``12.3 GB``, or ``456 MB`` below a gigabyte (a decimal place of a GB says little there)."""
    return f"{nbytes / GB:.1f} GB" if nbytes >= GB else f"{nbytes / 1e6:.0f} MB"


class NothingFitsError(ConfigError):
    """No candidate's estimate fits the device; the message names the smallest and
    what would make it fit."""


@attrs.frozen
class AutoChoice:
    """The chosen candidate and why, in one line.

    Parameters
    ----------
    label : str
        The chosen candidate, as ``--compare`` writes it (``'ddp'``, ``'deepspeed:zero2'``).
    reason : str
        Why, in one line (the run's summary line says it).
    """

    label: str
    reason: str


def auto_candidates(world_size: int) -> tuple[str, ...]:
    """What ``--strategy auto`` compares for ``world_size`` processes.

    Parameters
    ----------
    world_size : int
        The ranks the run will have.

    Returns
    -------
    tuple of str
        The candidates, cheapest communication first (:data:`AUTO_ORDER`; single
        device alone for one process).
    """
    return ("single",) if world_size == 1 else AUTO_ORDER


def _hint(best: CandidateEstimate, capacity: int) -> str:
    parts = best.parts
    activations = parts["activations"] or 0
    states = best.peak - activations
    ideas = []
    if best.memory.compute in ("fp32",):
        ideas.append("bf16 (halves activations)")
    if activations > capacity // 3:
        ideas.append("activation checkpointing or a smaller batch per rank "
                     f"(activations {_size(activations)})")
    if states > capacity // 3:
        ideas.append(f"more ranks or offload (model states {_size(states)})")
    return "; ".join(ideas) or "a larger device"


def choose_strategy(result: Estimate, capacity: int,
                    margin: float = AUTO_MARGIN) -> AutoChoice:
    """The first candidate of ``result`` (in its order) that fits ``capacity`` with ``margin``.

    Parameters
    ----------
    result : Estimate
        The estimates of the candidates, in the order to try them.
    capacity : int
        Bytes a rank has (:func:`device_memory`).
    margin : float, default AUTO_MARGIN
        The share of ``capacity`` left free.

    Returns
    -------
    AutoChoice
        The chosen candidate and why.

    Raises
    ------
    NothingFitsError
        None fits: the smallest estimate and what would make it fit.
    """
    usable = int(capacity * (1 - margin))
    for row in result.candidates:
        if row.trace is not None and row.peak <= usable:
            return AutoChoice(row.label, (
                f"the first in order of communication cost whose estimate, "
                f"{_size(row.peak)} per rank, fits {_size(capacity)} with a "
                f"{margin:.0%} margin"))
    best = min(result.candidates, key=lambda r: r.peak)
    if result.untraceable:
        raise NothingFitsError(f"--strategy auto needs activations, and the step cannot be "
                               f"traced: {result.untraceable}")
    raise NothingFitsError(
        f"no strategy fits {_size(capacity)} per rank (with a {margin:.0%} margin): the "
        f"smallest estimate is {best.label}, {_size(best.peak)}; try "
        f"{_hint(best, usable)}")
