"""``--strategy auto``: the first candidate, cheapest communication first, whose
per-rank peak fits the device and whose setup fits the node's host memory."""

from __future__ import annotations

import attrs

from flexgraph.training.errors import ConfigError

from ._estimate import CandidateEstimate, Estimate

AUTO_ORDER = ("ddp", "deepspeed:zero1", "deepspeed:zero2", "fsdp", "deepspeed:zero3",
              "deepspeed:zero3-offload")
AUTO_MARGIN = 0.10
"""Share of the device kept free: the allocator's cache, the CUDA context, fragmentation."""

GB = 1e9


def _size(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB" if nbytes >= GB else f"{nbytes / 1e6:.0f} MB"


class NothingFitsError(ConfigError):
    """No candidate fits; the message names the smallest and what would make it fit."""


@attrs.frozen
class AutoChoice:
    """The chosen candidate's label (as ``--compare`` writes it) and why, in one line."""

    label: str
    reason: str


def auto_candidates(world_size: int) -> tuple[str, ...]:
    """What ``--strategy auto`` compares for ``world_size`` processes, in order.

    Parameters
    ----------
    world_size : int

    Returns
    -------
    tuple of str
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


def setup_refusal(row: CandidateEstimate, host_memory: int, processes_per_node: int,
                  margin: float = AUTO_MARGIN) -> str | None:
    """Why ``row``'s setup does not fit a node's ``host_memory`` (``None``: it fits)."""
    if row.setup is None:
        return None
    needed = row.setup.node(processes_per_node)
    if needed <= int(host_memory * (1 - margin)):
        return None
    others = (f" + {processes_per_node - 1} x {_size(row.setup.others)}"
              if processes_per_node > 1 else "")
    return (f"{row.label}: its setup needs {_size(needed)} of host memory on a node (rank 0 "
            f"{_size(row.setup.rank0)}{others}), more than {_size(host_memory)} with a "
            f"{margin:.0%} margin")


def choose_strategy(result: Estimate, capacity: int, margin: float = AUTO_MARGIN, *,
                    host_memory: int | None = None, processes_per_node: int = 1
                    ) -> AutoChoice:
    """The first candidate of ``result`` that fits ``capacity`` with ``margin``.

    Parameters
    ----------
    result : Estimate
        The candidates' estimates, in the order to try them.
    capacity, host_memory : int
        Bytes a rank has; bytes one node's host has (``None``: setups not checked).
    margin : float, default AUTO_MARGIN
    processes_per_node : int, default 1

    Returns
    -------
    AutoChoice

    Raises
    ------
    NothingFitsError
        None fits, or every one that fits was refused for its setup.
    """
    usable = int(capacity * (1 - margin))
    refused = []
    for row in result.candidates:
        if row.trace is None or row.peak > usable:
            continue
        refusal = (None if host_memory is None
                   else setup_refusal(row, host_memory, processes_per_node, margin))
        if refusal is not None:
            refused.append(refusal)
            continue
        passed = f"; refused for their setup: {'; '.join(refused)}" if refused else ""
        return AutoChoice(row.label, (
            f"the first in order of communication cost whose estimate, "
            f"{_size(row.peak)} per rank, fits {_size(capacity)} with a "
            f"{margin:.0%} margin{passed}"))
    if refused:
        raise NothingFitsError(f"every strategy that fits the device was refused for its "
                               f"setup: {'; '.join(refused)}; give the node more memory "
                               f"(--host-memory), or fewer processes per node")
    best = min(result.candidates, key=lambda r: r.peak)
    if result.untraceable:
        raise NothingFitsError(f"--strategy auto needs activations, and the step cannot be "
                               f"traced: {result.untraceable}")
    raise NothingFitsError(
        f"no strategy fits {_size(capacity)} per rank (with a {margin:.0%} margin): the "
        f"smallest estimate is {best.label}, {_size(best.peak)}; try "
        f"{_hint(best, usable)}")
