"""Weights between a model and a checkpoint: what a file holds, and putting it in.

A checkpoint's weights are the state dict of the user's module, never of a
wrapper (DDP's ``module.`` prefix is stripped on the way in), under
``state_dict`` as MMEngine saves them, under ``model``, or a raw state dict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from flexgraph.training.components import unwrap_model
from flexgraph.training.errors import CheckpointError
from flexgraph.training.runtime import meta_parameters

__all__ = ["WeightsLoaded", "apply_weights", "matching_weights", "model_weights", "weights_in"]


_SIZE_MISMATCH = re.compile(r"^\s*size mismatch for (\S+): (.*)$")


@attrs.frozen
class WeightsLoaded:
    """What a non-strict load left out, as MMEngine warns of it.

    Tensors whose shapes differ keep their previous values, as in MMEngine. The
    value is false when nothing was left out.

    Parameters
    ----------
    missing : tuple of str, default ()
        The model's keys the checkpoint lacks.
    unexpected : tuple of str, default ()
        The checkpoint's keys the model has no place for.
    mismatched : tuple of str, default ()
        The tensors of another shape, one line each (``'head.weight: copying a
        param with shape ...'``).
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        """Whether anything was left out."""
        return bool(self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        """The keys left out, as MMEngine's ``load_state_dict`` warns of them."""
        parts = [f"{what} {list(keys)}" for what, keys in (
            ("missing keys", self.missing), ("unexpected keys", self.unexpected),
            ("tensors of another shape, left as they were:", self.mismatched)) if keys]
        return "; ".join(parts)


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
                  strict: bool) -> WeightsLoaded:
    """Load the weights in ``checkpoint`` into ``model`` (unwrapped).

    A ``module.`` prefix (from a DDP-wrapped save) is stripped. Non-strict loading
    (``load_from``, ``Pretrained``, as in MMEngine) returns the missing and
    unexpected keys and the tensors of another shape (a fine-tuning head), but
    refuses a file none of whose keys match, which is a wrong file, not a
    fine-tuning start. The model's ``load_state_dict`` pre-hooks see every
    tensor (mmpretrain's ViT resizes its position embedding there).

    Parameters
    ----------
    model : torch.nn.Module
        The model (wrapped or not) to load into.
    checkpoint : Any
        What was read: a checkpoint dict or a bare ``state_dict``.
    path : str
        Where it was read from, for messages.
    strict : bool
        Refuse any missing or unexpected key (``resume``) rather than report them
        (``load_from``).

    Returns
    -------
    WeightsLoaded
        What was left out (nothing under ``strict``).

    Raises
    ------
    CheckpointError
        The model still has parameters on the meta device, none of the file's keys
        match, or ``load_state_dict`` refuses the weights for another reason than
        shapes.
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
        mismatched = None if strict else _only_size_mismatches(str(exc))
        if mismatched is None:
            raise CheckpointError(f"cannot load {path!r} into {type(target).__name__}: "
                                  f"{exc}") from exc
        # torch copied every other tensor before it raised; MMEngine warns and goes on.
        keys = set(target.state_dict())
        return WeightsLoaded(missing=tuple(sorted(keys - set(weights))),
                             unexpected=tuple(sorted(set(weights) - keys)),
                             mismatched=mismatched)
    return WeightsLoaded(missing=tuple(result.missing_keys),
                         unexpected=tuple(result.unexpected_keys))


def _only_size_mismatches(message: str) -> tuple[str, ...] | None:
    """The ``size mismatch`` lines of torch's ``load_state_dict`` error, or ``None``
    when it holds any other error (which a non-strict load must not pass over)."""
    lines = [line for line in message.splitlines()[1:] if line.strip()]
    found = [_SIZE_MISMATCH.match(line) for line in lines]
    if not lines or not all(found):
        return None
    return tuple(f"{m.group(1)}: {m.group(2)}" for m in found if m)


def matching_weights(checkpoint: Any, path: str, shapes: Mapping[str, tuple[int, ...]],
                     owner: str) -> tuple[dict[str, Any], WeightsLoaded]:
    """The weights in ``checkpoint`` that fit the model, and what is left out.

    For loaders that put weights in one by one (into shards, into ZeRO-3
    partitions) rather than through ``load_state_dict``: ``shapes`` are the
    model's full shapes by key. A ``module.`` prefix is stripped; a tensor of
    another shape is left out (as in MMEngine); a file none of whose keys match
    is refused (``owner`` is the model's class name, for the message).

    Parameters
    ----------
    checkpoint : Any
        What was read: a checkpoint dict or a bare ``state_dict``.
    path : str
        Where it was read from, for messages.
    shapes : Mapping of str to tuple of int
        The model's full shapes by key.
    owner : str
        The model's class name, for the message.

    Returns
    -------
    tuple of (dict, WeightsLoaded)
        The fitting weights by key, and what was left out.

    Raises
    ------
    CheckpointError
        None of the file's keys match.
    """
    weights = {k.removeprefix("module."): v for k, v in weights_in(checkpoint, path).items()}
    named = {k: weights[k] for k in shapes if k in weights}
    if not named:
        raise CheckpointError(
            f"none of the {len(weights)} weights in {path!r} match a parameter of {owner} "
            f"(e.g. {next(iter(weights), '?')!r}); is it the right file?")
    fitting = {k: v for k, v in named.items() if tuple(v.shape) == tuple(shapes[k])}
    mismatched = tuple(f"{k}: copying a param with shape {tuple(v.shape)} from checkpoint, "
                       f"the shape in current model is {tuple(shapes[k])}."
                       for k, v in named.items() if k not in fitting)
    return fitting, WeightsLoaded(missing=tuple(k for k in shapes if k not in weights),
                                  unexpected=tuple(sorted(set(weights) - set(shapes))),
                                  mismatched=mismatched)
