"""What DeepSpeed needs from models that torch alone takes as they are.

MMDetection's models are ordinary torch modules, yet some of their habits
stop DeepSpeed before the first step:

* :func:`scalars_as_vectors`, :func:`scalars_restored`: 0-d parameters (the
  ``Scale`` modules of ATSS, FCOS, ...) fail in ``deepspeed.initialize`` when
  the engine broadcasts every replicated parameter as bytes
  (``p.data.view(torch.uint8)``, which a 0-d tensor cannot take). They are 1-d
  of one element while the engine is built, and 0-d views of the same storage
  afterwards: the model computes and saves them with their own shape. Under
  ZeRO-3 (:func:`scalar_safe_init`) they stay 1-d of one element, and
  checkpoints save them 0-d (:func:`saved_shape`).
* :func:`data_constructors_kept`: under ``zero.Init`` DeepSpeed replaces
  ``torch.Tensor(...)`` by a function that takes every argument for a size, so
  the legacy data constructor (``torch.Tensor([0.5, 1.0, 2.0])``,
  ``torch.Tensor(numpy_array)``: mmdet's anchor generators) fails with
  ``new_empty(): argument 'size' ...``. Data arguments go to torch's own
  constructor instead, as they would without ZeRO; sizes (numpy integers
  made ints) still reach DeepSpeed's.
* :func:`norm_statistics_cast`: in bf16 (or fp16) DeepSpeed casts the
  parameters and, since 0.19, keeps every buffer as it was unless
  ``data_types.buffer_dtype`` says otherwise. A BatchNorm layer then holds
  bf16 weights beside fp32 running statistics, which ``batch_norm`` refuses
  (``expected scalar type BFloat16 but found Float``: ResNet's under ZeRO-1
  and 2). The running statistics of the normalisation layers follow their
  weights' dtype, as ``module.bfloat16()`` cast them; other buffers (a data
  preprocessor's mean and std) stay as DeepSpeed keeps them.
* :func:`allow_torch_optimizer`: ZeRO refuses an optimizer it has not tested
  (torch's SGD, the configs' default) with a bare ``AssertionError`` unless the
  config sets ``zero_allow_untested_optimizer``. ZeRO hands the optimizer one
  flat partition per parameter group, not the parameters, which changes nothing
  for an optimizer that updates each element on its own (torch's SGD, Adam,
  RMSprop, ...): for those flexgraph sets the key, and says so in the log.
  Another (LARS, LAMB: trust ratios from a parameter's norms) would take its
  statistics over the partition and train other weights than under DDP: it is
  refused in one line unless the user sets the key.

Nothing here is imported at plan time.
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
               "RMSprop", "Rprop", "ASGD")
"""torch's optimizers that update each element from its own gradient and state alone."""
SAVED_SHAPE = "flexgraph_saved_shape"
"""The attribute of a ZeRO-3 parameter that was 0-d: its shape in checkpoints."""


def scalars_as_vectors(model: nn.Module) -> list[nn.Parameter]:
    """Make each 0-d parameter of ``model`` 1-d of one element, for ``deepspeed.initialize``;
    returns them, for :func:`scalars_restored`."""
    scalars = [p for p in model.parameters() if p.dim() == 0 and not hasattr(p, "ds_shape")]
    for param in scalars:
        param.data = param.data.reshape(1)
    return scalars


def scalars_restored(scalars: list[nn.Parameter], zero_optimizer: Any) -> None:
    """The parameters :func:`scalars_as_vectors` changed, 0-d again, in the engine's storage.

    Each becomes a 0-d view of its 1-d storage: under ZeRO-1 and ZeRO-2 that is
    the engine's flat buffer, so the optimizer's updates still reach the model.
    ZeRO-1/2 re-view every parameter into that buffer after each step, by the
    shapes it recorded when it was built (``round_robin_bit16_meta``); those of
    the scalars are made 0-d too.
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
    """``deepspeed.zero.Init`` that partitions 0-d parameters too (ZeRO-3).

    ZeRO-3 broadcasts each parameter as bytes when it partitions it, and again
    whenever a gathered parameter is modified (``GatheredParameters`` with a
    ``modifier_rank``, ``Module.apply``), which a 0-d tensor cannot take. So a
    0-d parameter is partitioned, gathered and trained as one element of one
    dimension (``x * scale`` computes the same); its own shape is kept in
    :data:`SAVED_SHAPE`, which the checkpoints take (see
    :func:`saved_shape`). Returns a subclass of ``deepspeed.zero.Init``.
    """

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
    """Inside ``zero.Init``: ``torch.Tensor(data)`` builds from data, as torch does.

    DeepSpeed keeps torch's own ``torch.Tensor.__new__`` as
    ``torch.Tensor.__old_new__`` while its context is entered; its replacement
    calls ``new_empty(*args)``, right for sizes only. A call whose arguments are
    not all whole numbers (a list, a numpy array, a float) is handed to torch's.
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
    """Cast each normalisation layer's running statistics to its weight's dtype in the
    engine's ``model``; returns how many layers'.

    Left alone where the DeepSpeed ``config`` sets ``data_types.buffer_dtype``
    (DeepSpeed then casts every buffer itself) and where a layer has no weight
    (its fp32 statistics run beside bf16 inputs).
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
    """Set ``zero_allow_untested_optimizer`` in the resolved ``config`` for an element-wise
    ``optimizer`` ZeRO has not tested, and ``log`` it.

    ``tested``: DeepSpeed's own list by default (``is_zero_supported_optimizer``,
    which needs the process group). A :class:`ConfigError` names the key where
    the config sets it to false, or leaves it unset for an optimizer not known
    to be element-wise, instead of DeepSpeed's assertion or a different optimizer.
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
