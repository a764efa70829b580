"""What DeepSpeed needs from models that torch alone takes as they are.

MMDetection's models stop DeepSpeed before the first step: 0-d parameters (``Scale``),
``torch.Tensor(data)`` under ``zero.Init``, fp32 running statistics beside bf16 weights,
torch's SGD refused with a bare ``AssertionError``.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from flexgraph.training.errors import ConfigError

__all__ = ["allow_torch_optimizer", "data_constructors_kept", "norm_statistics_cast",
           "saved_shape", "scalar_safe_init", "scalars_as_vectors", "scalars_restored"]

UNTESTED = "zero_allow_untested_optimizer"
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta",
               "RMSprop", "Rprop", "ASGD")  # each element updated from its own state alone
SAVED_SHAPE = "flexgraph_saved_shape"  # a ZeRO-3 parameter that was 0-d: its saved shape


def scalars_as_vectors(model: nn.Module) -> list[nn.Parameter]:
    """Each 0-d parameter of ``model`` made 1-d, for ``deepspeed.initialize``; returns them."""
    scalars = [p for p in model.parameters() if p.dim() == 0 and not hasattr(p, "ds_shape")]
    for param in scalars:
        param.data = param.data.reshape(1)
    return scalars


def scalars_restored(scalars: list[nn.Parameter], zero_optimizer: Any) -> None:
    """The parameters :func:`scalars_as_vectors` changed, 0-d again, in the engine's storage.

    The shapes ZeRO-1/2 re-view after each step are made 0-d too.
    """
    if not scalars:
        return
    for param in scalars:
        param.data = param.data.view(())
    ids = {id(p) for p in scalars}
    for params, shapes in zip(getattr(zero_optimizer, "round_robin_bit16_groups", ()),
                              getattr(zero_optimizer, "round_robin_bit16_meta", ()),
                              strict=False):
        for index, param in enumerate(params):
            if id(param) in ids:
                shapes[index] = torch.empty((), dtype=param.dtype, device="meta")


def scalar_safe_init(deepspeed: Any) -> type:
    """A ``deepspeed.zero.Init`` that trains a 0-d parameter as 1-d (ZeRO-3 broadcasts bytes)."""

    class ScalarSafeInit(deepspeed.zero.Init):
        def _zero_init_param(self, param: nn.Parameter) -> None:
            if param.dim() == 0:
                setattr(param, SAVED_SHAPE, param.shape)
                param.data = param.data.reshape(1)
            super()._zero_init_param(param)

    return ScalarSafeInit


def saved_shape(param: nn.Parameter, value: torch.Tensor) -> torch.Tensor:
    """``value`` (a whole weight or optimizer state of ``param``) in ``param``'s own shape."""
    shape = getattr(param, SAVED_SHAPE, None)
    return value if shape is None else value.reshape(shape)


@contextlib.contextmanager
def data_constructors_kept() -> Iterator[None]:
    """Inside ``zero.Init``: ``torch.Tensor(data)`` builds from data (mmdet's anchors).

    DeepSpeed's replacement takes every argument for a size.
    """
    replaced = torch.Tensor.__new__
    original = getattr(torch.Tensor, "__old_new__", None)
    if original is None or replaced is original:
        yield
        return
    torch.Tensor.__new__ = _sizes_or_data(replaced, original)
    try:
        yield
    finally:
        torch.Tensor.__new__ = replaced


def _sizes_or_data(sizes: Callable[..., Any], data: Callable[..., Any]) -> Callable[..., Any]:
    def new_tensor(cls: type, *args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) == 1 and isinstance(args[0], torch.Size):
            return sizes(cls, *args, **kwargs)
        whole = [_whole(a) for a in args]
        if None in whole:
            return data(cls, *args, **kwargs)
        return sizes(cls, *whole, **kwargs)

    return new_tensor


def _whole(value: Any) -> int | None:
    """``value`` as a size (an int, a numpy integer), or None for data."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def norm_statistics_cast(model: nn.Module, config: dict[str, Any]) -> int:
    """Cast each normalisation layer's running statistics to its weight's dtype; returns how many.

    Unless ``config`` sets ``data_types.buffer_dtype`` (DeepSpeed casts then).
    """
    if (config.get("data_types") or {}).get("buffer_dtype") is not None:
        return 0
    cast = 0
    norms = (m for m in model.modules()
             if isinstance(m, nn.modules.batchnorm._NormBase) and m.weight is not None)
    for norm in norms:
        statistics = [b for b in (norm.running_mean, norm.running_var)
                      if b is not None and b.dtype != norm.weight.dtype]
        for buffer in statistics:
            buffer.data = buffer.data.to(norm.weight.dtype)
        cast += bool(statistics)
    return cast


def allow_torch_optimizer(config: dict[str, Any], optimizer: Any, log: Callable[[str], Any],
                          tested: Callable[[Any], bool] | None = None) -> None:
    """Set ``zero_allow_untested_optimizer`` for an element-wise optimizer ZeRO has not tested.

    ZeRO hands the optimizer flat partitions: one that takes norms (LARS, LAMB) would
    train other weights than DDP, and is refused. ``tested``: DeepSpeed's list by default.
    """
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    if optimizer is None or not stage:
        return
    if tested is None:
        from deepspeed.runtime.zero.utils import is_zero_supported_optimizer as tested
    if tested(optimizer):
        return
    name = type(optimizer).__name__
    elementwise = type(optimizer) in {getattr(torch.optim, n) for n in ELEMENTWISE}
    if config.get(UNTESTED) is None and elementwise:
        config[UNTESTED] = True
        log(f"DeepSpeed ZeRO-{stage} with {name}, an optimizer DeepSpeed has not tested: "
            f"{UNTESTED}=True set (set it to false to refuse instead)")
    elif config.get(UNTESTED) is None:
        raise ConfigError(
            f"strategy 'deepspeed': ZeRO-{stage} hands {name} one flat partition per "
            f"parameter group, not the parameters, and DeepSpeed has not tested it; an "
            f"optimizer that takes statistics over a parameter (LARS's and LAMB's trust "
            f"ratios) would take them over the partition and train other weights than under "
            f"DDP; use DDPStrategy or FSDPStrategy (which keep parameters apart), or set "
            f"strategy.config['{UNTESTED}']=True if {name} updates each element on its own")
    elif not config[UNTESTED]:
        raise ConfigError(f"strategy 'deepspeed': ZeRO-{stage} refuses {name}, an optimizer "
                          f"DeepSpeed has not tested, while {UNTESTED} is false; set "
                          f"strategy.config['{UNTESTED}']=True (or drop it) to train with it")
