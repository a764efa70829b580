"""Training state (RNG and scheduler states) in a form ``torch.load(weights_only=True)`` accepts."""

from __future__ import annotations

import collections
from typing import Any

import attrs
import numpy as np
import torch


@attrs.frozen
class LoopState:
    """Where training starts: the ``resume`` step's answer to the ``train`` step.

    Parameters
    ----------
    epoch, iter
        MMEngine's counters at the save.
    batch_idx
        Batches of the next pass over the data already trained on.
    data_pass
        Complete passes over the data.
    rng_state
        This rank's, restored before the first batch; ``None``: leave the streams.
    resumed_from
        The checkpoint restored; ``None`` for a fresh run.
    """

    epoch: int = 0
    iter: int = 0
    batch_idx: int = 0
    data_pass: int = 0
    rng_state: dict[str, Any] | None = attrs.field(default=None, repr=False)
    resumed_from: str | None = None


_TAG = "__flexgraph_type__"
_DROP = object()


def to_plain(obj: Any) -> Any:
    """``obj`` with every value turned into something ``weights_only`` loads (``None``: none)."""
    out = _plain(obj)
    return None if out is _DROP else out


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor, torch.dtype,
                                       torch.device, torch.Size)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, collections.Counter):
        return {_TAG: "Counter", "items": [[_plain(k), _plain(v)] for k, v in obj.items()]}
    if isinstance(obj, (set, frozenset)):
        return {_TAG: type(obj).__name__, "items": [_plain(v) for v in obj]}
    if isinstance(obj, dict):
        kind = "OrderedDict" if isinstance(obj, collections.OrderedDict) else "dict"
        items = {k: _plain(v) for k, v in obj.items()}
        items = {k: v for k, v in items.items() if v is not _DROP}
        return collections.OrderedDict(items) if kind == "OrderedDict" else items
    if isinstance(obj, (list, tuple)):
        items = [_plain(v) for v in obj]
        if any(v is _DROP for v in items):
            return _DROP  # a sequence with a hole would change meaning
        return items if isinstance(obj, list) else tuple(items)
    return _DROP


def from_plain(obj: Any) -> Any:
    """Inverse of :func:`to_plain` (dropped values stay absent)."""
    if isinstance(obj, dict):
        kind = obj.get(_TAG)
        if kind == "Counter":
            return collections.Counter({from_plain(k): from_plain(v) for k, v in obj["items"]})
        if kind in ("set", "frozenset"):
            items = (from_plain(v) for v in obj["items"])
            return set(items) if kind == "set" else frozenset(items)
        rebuilt = {k: from_plain(v) for k, v in obj.items()}
        return collections.OrderedDict(rebuilt) if isinstance(obj, collections.OrderedDict) \
            else rebuilt
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    return obj
