"""Models whose parameters do not exist yet: built on the meta device.

A model too large for one rank's memory is built with its parameters on
PyTorch's ``meta`` device (shapes, no storage); a strategy that shards it
gives each rank storage for its own part later (FSDP's
:mod:`flexgraph.strategies.fsdp.shards`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

__all__ = ["meta_parameters", "parameters_on_meta"]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on ``meta``; buffers stay real.

    Buffers are often computed in ``__init__`` (positional tables, BatchNorm
    statistics) with no method to recompute them later, so they keep their values.
    """
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
        The model (each rank holds its own shards).

    Returns
    -------
    list of str
        The names, parameters first; empty when the model has storage everywhere.
    """
    return [name for name, t in [*model.named_parameters(), *model.named_buffers()]
            if t.device.type == "meta"]
