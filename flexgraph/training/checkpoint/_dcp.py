"""Checkpoints through ``torch.distributed.checkpoint`` (DCP), as every strategy reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from flexgraph.training.checkpoint._io import NOTHING_READ, OnRead
from flexgraph.training.checkpoint._weights import WeightsLoaded
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import SafeDCPStorage, dcp_load, dcp_problem

SHARDED_KEYS = ("state_dict", "optimizer")
"""The checkpoint entries DCP writes shard by shard; the rest go into ``extra.pth``."""


def full_tensors(value: Any) -> Any:
    """``value`` with DTensors gathered into whole CPU tensors (a collective).

    Parameters
    ----------
    value : Any

    Returns
    -------
    Any
    """
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    if isinstance(value, dict):
        return {k: full_tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(full_tensors(v) for v in value)
    return value


def load_dcp_weights(path: Path, model: torch.nn.Module, *, on_read: OnRead) -> WeightsLoaded:
    """Load the model weights of the DCP checkpoint ``path`` into ``model``, non-strictly.

    Parameters
    ----------
    path : Path
    model : torch.nn.Module
    on_read : callable
        Called with an empty checkpoint.

    Returns
    -------
    WeightsLoaded
    """
    from torch.distributed.tensor import DTensor

    on_read(dict(NOTHING_READ))
    problem = dcp_problem(path, need_extra=False)
    if problem is not None:
        raise CheckpointError(problem)
    metadata = SafeDCPStorage(path).read_metadata()
    keys = metadata.state_dict_metadata
    under = "state_dict." if any(k.startswith("state_dict.") for k in keys) else ""
    saved = {key.removeprefix(under) for key in metadata.state_dict_metadata
             if key.startswith(under)}
    current = get_model_state_dict(model)
    wanted = {k: v for k, v in current.items() if k in saved}
    if not wanted:
        raise CheckpointError(
            f"none of the weights in {str(path)!r} match a parameter of "
            f"{type(model).__name__}; is it the right checkpoint?")
    state = {"state_dict": wanted} if under else wanted
    # whole tensors are read by each rank alone: the rank that initialises for all loads
    # its Pretrained files by itself
    alone = not any(isinstance(v, DTensor) for v in wanted.values())
    dcp_load(state, path, partial=True, alone=alone)
    set_model_state_dict(model, state["state_dict"] if under else state,
                         options=StateDictOptions(strict=False))
    return WeightsLoaded(missing=tuple(sorted(set(current) - set(wanted))),
                         unexpected=tuple(sorted(saved - set(current))))
