"""One ``torch.save`` file per checkpoint, and reading an optimizer state from one."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, ClassVar

import torch

from flexgraph.training.checkpoint._dcp import load_dcp_weights
from flexgraph.training.checkpoint._io import CheckpointIO, CheckpointRestorer, OnRead
from flexgraph.training.checkpoint._weights import WeightsLoaded, apply_weights
from flexgraph.training.components import unwrap_model
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import (
    DCP_DIRECTORY,
    TORCH_SAVE_FILE,
    CheckpointFormat,
    file_problem,
    read_any_checkpoint,
    read_checkpoint_file,
)
from flexgraph.training.runtime import this_rank


class OneFileChecks(CheckpointRestorer):
    """When a one-file checkpoint is whole (its zip directory; the CRCs are checked on read)."""

    format = TORCH_SAVE_FILE

    def is_complete(self, path: Path) -> bool:
        return TORCH_SAVE_FILE.recognise(path)

    def problem(self, path: Path) -> str | None:
        found = file_problem(path, verify=False) if path.is_file() else None
        return found or super().problem(path)

    def incomplete(self, path: Path) -> str | None:
        return file_problem(path, verify=False)


class FileCheckpointIO(OneFileChecks, CheckpointIO):
    """One ``torch.save`` file in MMEngine's layout, written by rank 0 (single device, DDP)."""

    def states(self, model: torch.nn.Module, optim_wrapper: Any) -> dict[str, Any]:
        return {"state_dict": unwrap_model(model).state_dict(),
                "optimizer": optim_wrapper.state_dict() if optim_wrapper is not None else None}

    def write(self, checkpoint: dict[str, Any], path: Path, *, model: Any = None,
              optim_wrapper: Any = None) -> None:
        if this_rank() != 0:
            return
        with open(path, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())

    maps_weights: ClassVar[bool] = True
    """Whether :meth:`read` leaves the weights in the file's map, so they are copied once."""

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        checkpoint = read_checkpoint_file(path, mmap=self.maps_weights)
        if not self.maps_weights:
            return checkpoint
        if not isinstance(checkpoint, dict):
            return copied_out(checkpoint)
        return {k: v if k == "state_dict" else copied_out(v) for k, v in checkpoint.items()}

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: torch.nn.Module,
              optim_wrapper: Any, strict: bool = True) -> None:
        apply_weights(model, checkpoint, str(path), strict=strict)
        if optim_wrapper is not None and checkpoint.get("optimizer") is not None:
            load_optimizer_state(optim_wrapper, checkpoint["optimizer"], path)

    def load_weights(self, path: Path, model: Any, *, held: CheckpointFormat,
                     on_read: OnRead) -> WeightsLoaded:
        if held is DCP_DIRECTORY:
            return load_dcp_weights(path, model, on_read=on_read)
        checkpoint = read_any_checkpoint(path, held=held)
        on_read(checkpoint)
        return apply_weights(model, checkpoint, str(path), strict=False)


def copied_out(value: Any) -> Any:
    """``value`` with every tensor copied out of a file's map."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (dict, list)):
        keys = value.keys() if isinstance(value, dict) else range(len(value))
        items = {k: copied_out(value[k]) for k in keys}
        if all(items[k] is value[k] for k in keys):
            return value
        out = copy.copy(value)
        for k, v in items.items():
            out[k] = v
        return out
    if isinstance(value, tuple):
        items = [copied_out(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def optimizer_keyed_by(state: Any) -> str | None:
    """How a saved optimizer state names its parameters.

    Parameters
    ----------
    state : Any

    Returns
    -------
    str or None
        ``'position'``, ``'name'``, or ``None`` (none, or several optimizers).
    """
    groups = state.get("param_groups") if isinstance(state, dict) else None
    params = [p for g in groups or () if isinstance(g, dict) for p in g.get("params", ())]
    if not params:
        return None
    return "name" if all(isinstance(p, str) for p in params) else "position"


def load_optimizer_state(optim_wrapper: Any, state: Any, path: Path) -> None:
    """``optim_wrapper.load_state_dict(state)``; a mismatch names the checkpoint."""
    try:
        optim_wrapper.load_state_dict(state)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot load the optimizer state of {str(path)!r}: {detail}; resume with the "
            f"model and optimizer config it was saved with") from exc
