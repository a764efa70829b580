"""Weights between a model and a checkpoint: what a file holds, and putting it in.

A checkpoint's weights are the state dict of the user's module, never of a
wrapper (DDP's ``module.`` prefix is stripped on the way in), under
``state_dict`` as MMEngine saves them, under ``model``, or a raw state dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from flexgraph.training.components import unwrap_model
from flexgraph.training.errors import CheckpointError
from flexgraph.training.runtime import meta_parameters

__all__ = ["apply_weights", "model_weights", "weights_in"]


def model_weights(model: torch.nn.Module) -> dict[str, Any]:
    """The state dict of the user's module (never DDP's ``module.``-prefixed one)."""
    return unwrap_model(model).state_dict()


def weights_in(checkpoint: Any, path: str) -> Mapping[str, Any]:
    """The model weights inside a loaded checkpoint (flexgraph/MMEngine layout or raw)."""
    if isinstance(checkpoint, Mapping):
        for key in ("state_dict", "model"):
            inner = checkpoint.get(key)
            if isinstance(inner, Mapping) and inner and all(
                isinstance(v, torch.Tensor) for v in inner.values()
            ):
                return inner
        if checkpoint and all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
            return checkpoint  # a raw state_dict
    keys = sorted(checkpoint)[:8] if isinstance(checkpoint, Mapping) else type(checkpoint)
    raise CheckpointError(
        f"{path!r} holds no model weights (found {keys}); load_from takes a flexgraph / "
        f"MMEngine checkpoint (weights under 'state_dict') or a raw state_dict file"
    )


def apply_weights(model: torch.nn.Module, checkpoint: Any, path: str, *,
                  strict: bool, logger: Any = None) -> None:
    """Load the weights in ``checkpoint`` into ``model`` (unwrapped).

    A ``module.`` prefix (from a DDP-wrapped save) is stripped. Non-strict loading
    (``load_from``, as in MMEngine) logs missing and unexpected keys but refuses a
    file none of whose keys match, which is a wrong file, not a fine-tuning start.
    """
    weights = {k.removeprefix("module."): v for k, v in weights_in(checkpoint, path).items()}
    target = unwrap_model(model)
    unmade = meta_parameters(target)
    if unmade:
        raise CheckpointError(
            f"cannot load {path!r}: {type(target).__name__} has {len(unmade)} parameters on "
            f"the meta device (e.g. {unmade[0]!r}), which have no storage to load into; a "
            f"model built with build_model(device='meta') must be materialized (and, when "
            f"sharded, loaded by its strategy's sharded loader) before weights go in"
        )
    if not strict and not set(weights) & set(target.state_dict()):
        raise CheckpointError(
            f"none of the {len(weights)} weights in {path!r} match a parameter of "
            f"{type(target).__name__} (e.g. {next(iter(weights))!r}); is it the right file?"
        )
    try:
        result = target.load_state_dict(weights, strict=strict)
    except RuntimeError as exc:
        raise CheckpointError(f"cannot load {path!r} into {type(target).__name__}: "
                              f"{exc}") from exc
    if logger is not None and (result.missing_keys or result.unexpected_keys):
        logger.warning(f"load_from {path}: missing keys {result.missing_keys}, "
                       f"unexpected keys {result.unexpected_keys}")
