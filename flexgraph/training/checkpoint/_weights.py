"""Weights between a model and a checkpoint: the user's module's, never a wrapper's."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from flexgraph.training.components import unwrap_model
from flexgraph.training.errors import CheckpointError
from flexgraph.training.runtime import meta_parameters

_SIZE_MISMATCH = re.compile(r"^\s*size mismatch for (\S+): (.*)$")


@attrs.frozen
class WeightsLoaded:
    """What a non-strict load left out, as MMEngine warns of it; false when nothing was.

    Parameters
    ----------
    missing, unexpected : tuple of str
    mismatched : tuple of str
        The tensors of another shape (left as they were), one line each.
    checksums : mapping of str to float
        This rank's :func:`local_checksums` of what went in.
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()
    checksums: Mapping[str, float] = attrs.field(factory=dict, eq=False)

    def went_in(self, keys: Any) -> list[str]:
        """Those of the model's ``keys`` the load put in."""
        skipped = set(self.missing) | {line.partition(":")[0] for line in self.mismatched}
        return [k for k in keys if k not in skipped]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        """The keys left out, as MMEngine's ``load_state_dict`` warns of them."""
        parts = [f"{what} {list(keys)}" for what, keys in (
            ("missing keys", self.missing), ("unexpected keys", self.unexpected),
            ("tensors of another shape, left as they were:", self.mismatched)) if keys]
        return "; ".join(parts)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: a DTensor's shard, a ZeRO-3 partition, or itself."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def local_checksums(model: torch.nn.Module, names: Any) -> dict[str, float]:
    """The float64 sum of this rank's part of each floating ``state_dict`` entry in ``names``.

    Parameters
    ----------
    model : torch.nn.Module
    names : iterable of str

    Returns
    -------
    dict of str to float
    """
    entries = model.state_dict(keep_vars=True)
    with torch.no_grad():
        return {name: float(_local(entries[name]).sum(dtype=torch.float64))
                for name in names if name in entries and entries[name].is_floating_point()}


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
    """Load the weights in ``checkpoint`` into ``model`` (wrapped or not).

    Non-strict (``load_from``) still refuses a file none of whose keys match.

    Parameters
    ----------
    model : torch.nn.Module
    checkpoint : Any
        A checkpoint dict or a bare ``state_dict``.
    path : str
    strict : bool

    Returns
    -------
    WeightsLoaded
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
    """The ``size mismatch`` lines of torch's error, or ``None`` when it holds another."""
    lines = [line for line in message.splitlines()[1:] if line.strip()]
    found = [_SIZE_MISMATCH.match(line) for line in lines]
    if not lines or not all(found):
        return None
    return tuple(f"{m.group(1)}: {m.group(2)}" for m in found if m)


def matching_weights(checkpoint: Any, path: str, shapes: Mapping[str, tuple[int, ...]],
                     owner: str) -> tuple[dict[str, Any], WeightsLoaded]:
    """The weights in ``checkpoint`` that fit ``shapes`` (whole, by name), and what is left
    out; refuses a file none of whose keys match."""
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
