"""ZeRO-3 and second copies of the weights: refused by name, before training.

MMEngine's averaged models (``EMAHook``, MMDetection's ``ExpMomentumEMA``,
MMPreTrain's EMA) deep-copy the model they average. Under ZeRO-3 the copy of a
partitioned model holds empty placeholders, and the averaging then fails on the
first iteration with a shape error. :func:`refuse_copies` makes that deep copy
say so in one line, with the strategies that keep such a copy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn

from flexgraph.training.errors import TrainingError

__all__ = ["copies_refused", "refuse_copies"]

REFUSAL = ("ZeRO-3: copy.deepcopy of the partitioned model (an EMAHook's averaged copy, a "
           "teacher) copies empty placeholders; use DeepSpeed ZeRO-1/2 or DDPStrategy, or "
           "FSDPStrategy, which keeps the averaged copy sharded like the model")


def _refuse(memo: Any = None) -> Any:
    raise TrainingError(REFUSAL)


def refuse_copies(model: nn.Module) -> None:
    """``copy.deepcopy(model)`` raises :data:`REFUSAL` (this model alone)."""
    model.__dict__["__deepcopy__"] = _refuse


def copies_refused(step: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """A ZeRO-3 setup step whose model then refuses deep copies."""

    @functools.wraps(step)
    def refusing(*args: Any, **kwargs: Any) -> nn.Module:
        model = step(*args, **kwargs)
        refuse_copies(model)
        return model

    return refusing
