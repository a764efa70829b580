"""Models built with their parameters on the ``meta`` device, for a strategy to shard later."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on ``meta``; buffers stay real (they are
    often computed in ``__init__``, with no method to recompute them later)."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        param = module._parameters.get(name)
        if param is not None and param.device.type != "meta":
            kwargs = dict(param.__dict__)
            module._parameters[name] = type(param)(
                param.to("meta"), requires_grad=param.requires_grad, **kwargs
            )

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def meta_parameters(model: nn.Module) -> list[str]:
    """Names of ``model``'s parameters and buffers that live on the meta device.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    list of str
        Parameters first.
    """
    return [name for name, t in [*model.named_parameters(), *model.named_buffers()]
            if t.device.type == "meta"]
