"""Resuming a one-file checkpoint (``.pth``) under a strategy that writes another format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flexgraph.training.checkpoint._access import StateAccess, positions_to_names, restore_into
from flexgraph.training.checkpoint._file import OneFileChecks, optimizer_keyed_by
from flexgraph.training.checkpoint._weights import weights_in
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import read_checkpoint_file


class FileStateRestorer(OneFileChecks):
    """Restores a ``.pth`` checkpoint through a strategy's :class:`StateAccess`.

    Parameters
    ----------
    access
    """

    def __init__(self, access: StateAccess) -> None:
        self.access = access

    def read(self, path: Path, *, model: Any = None, optim_wrapper: Any = None) -> dict[str, Any]:
        checkpoint = read_checkpoint_file(path)
        if not isinstance(checkpoint, dict):
            raise CheckpointError(f"checkpoint {str(path)!r} holds a "
                                  f"{type(checkpoint).__name__}, not a checkpoint dict")
        checkpoint = dict(checkpoint)
        checkpoint["state_dict"] = dict(weights_in(checkpoint, str(path)))
        optimizer = checkpoint.get("optimizer")
        if optim_wrapper is None or optimizer is None:
            checkpoint.pop("optimizer", None)
        elif optimizer_keyed_by(optimizer) == "position":
            current = self.access.optimizer_state(model, optim_wrapper)["param_groups"]
            try:
                checkpoint["optimizer"] = positions_to_names(
                    optimizer, [list(g["params"]) for g in current],
                    self.access.parameter_names(model))
            except ValueError as exc:
                raise CheckpointError(
                    f"cannot resume {str(path)!r} under this strategy: {exc}; resume with "
                    f"the model and optimizer config it was saved with") from exc
        elif optimizer_keyed_by(optimizer) != "name":
            raise CheckpointError(
                f"cannot resume {str(path)!r} under this strategy: its optimizer state is "
                f"not one optimizer's state_dict; resume it with the strategy that wrote it")
        return checkpoint

    def apply(self, checkpoint: dict[str, Any], path: Path, *, model: Any,
              optim_wrapper: Any, strict: bool = True) -> None:
        restore_into(self.access, checkpoint, repr(str(path)), model=model,
                     optim_wrapper=optim_wrapper, full=True, strict=strict)
