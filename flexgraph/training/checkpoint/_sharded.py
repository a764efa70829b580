"""``load_from`` into a model whose weights are split over the ranks (FSDP2, ZeRO-3)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import torch

from flexgraph.training.checkpoint._io import NOTHING_READ, OnRead
from flexgraph.training.checkpoint._weights import WeightsLoaded, matching_weights
from flexgraph.training.components import unwrap_model
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import (
    CheckpointFormat,
    MappedCheckpoint,
    map_checkpoint,
    open_checkpoint,
    tensor_paths,
)
from flexgraph.training.runtime import agreed, broadcast_from_rank0, rank0_does, this_rank


@attrs.frozen
class Slices:
    """How a strategy's ranks hold the model's weights, as :func:`load_into_slices` needs it.

    Parameters
    ----------
    read_own : callable
        ``read_own(entry, value, mapped)``: this rank's slice of ``value`` into ``entry``.
    receive : callable
        ``receive(entry, value)``, a collective: ``value`` whole on rank 0, else ``None``.
    whole_shape : callable, optional
        An entry's whole shape (default: its ``shape``).
    """

    read_own: Callable[[torch.Tensor, torch.Tensor, MappedCheckpoint], None]
    receive: Callable[[torch.Tensor, torch.Tensor | None], None]
    whole_shape: Callable[[torch.Tensor], tuple[int, ...]] = lambda entry: tuple(entry.shape)


def load_into_slices(path: Path, held: CheckpointFormat, model: torch.nn.Module,
                     slices: Slices, *, on_read: OnRead) -> WeightsLoaded:
    """The weights at ``path`` (of format ``held``) into this rank's slices of ``model``.

    Parameters
    ----------
    path : Path
    held : CheckpointFormat
    model : torch.nn.Module
    slices : Slices
    on_read : callable

    Returns
    -------
    WeightsLoaded
        The same on every rank.
    """
    target = unwrap_model(model)
    entries = target.state_dict(keep_vars=True)
    shapes = {name: slices.whole_shape(entry) for name, entry in entries.items()}
    owner = type(target).__name__

    def read_own() -> WeightsLoaded | None:
        mapped = map_checkpoint(path, held)
        if mapped is None:
            return None
        on_read(mapped.checkpoint)
        weights, left_out = matching_weights(mapped.checkpoint, str(path), shapes, owner)
        with torch.no_grad():
            for name, entry in entries.items():
                if name in weights:
                    slices.read_own(entry, weights[name], mapped)
        return left_out

    loaded = agreed(read_own, kind=CheckpointError)
    if loaded is not None:
        return loaded
    return _through_rank0(path, held, entries, shapes, owner, slices, on_read)


def _through_rank0(path: Path, held: CheckpointFormat, entries: dict[str, Any],
                   shapes: dict[str, tuple[int, ...]], owner: str, slices: Slices,
                   on_read: OnRead) -> WeightsLoaded:
    """Rank 0 opens ``path`` and sends one tensor at a time."""
    source = rank0_does(lambda: open_checkpoint(path, held=held), share_result=False)
    checkpoint = source.layout if source is not None else dict(NOTHING_READ)
    on_read(checkpoint)
    found = rank0_does(lambda: matching_weights(checkpoint, str(path), shapes, owner),
                       share_result=False)
    weights, left_out = found if found is not None else ({}, None)
    names = set(broadcast_from_rank0(sorted(weights)))
    left_out = broadcast_from_rank0(left_out)
    where = {} if source is None else {id(t): key for key, t in tensor_paths(source.layout)}

    def value(name: str) -> torch.Tensor:
        tensor = weights[name]  # a hook's replacement is used as it is
        return source.fetch(where[id(tensor)]) if id(tensor) in where else tensor

    with torch.no_grad():
        for name, entry in entries.items():
            if name in names:
                slices.receive(entry, value(name) if this_rank() == 0 else None)
    return left_out
