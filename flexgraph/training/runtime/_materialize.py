"""Models whose parameters do not exist yet: built on the meta device, filled in later.

A model too large for one rank's memory is built with its parameters on
PyTorch's ``meta`` device (shapes, no storage), sharded, and only then given
storage for each rank's own shard, into which its weights are loaded (FSDP's
``skip_init_weights`` path). This module holds the pieces of that path that are
not specific to any strategy:

* :func:`parameters_on_meta`: build with parameters on ``meta`` but buffers
  real. Parameters are large and come from a checkpoint anyway; buffers are
  small and often *computed* in ``__init__`` (positional tables, BatchNorm
  statistics), with no method that could recompute them later, so they keep
  their values. The tensors ``nn.Module``s create for their parameters come from
  ``torch.empty`` and are moved to ``meta`` as they are registered, before any
  initialiser writes to them, so the build costs neither memory nor init time
  (the same approach as accelerate's ``init_empty_weights(include_buffers=False)``).
* :func:`materialize_module`: storage for the parameters, buffers put back,
  every floating-point parameter filled with NaN until something loads it.
* :func:`uninitialised_parameters` / :func:`meta_parameters`: names of
  parameters that nothing loaded, or that still have no storage, so that a
  loader can refuse such a model instead of training on garbage.

Initialising such a model is another matter: MMEngine's initialisers write
whole tensors, and a sharded init draws other random numbers than a
single-device run, so a strategy that initialises builds the model whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = [
    "materialize_module",
    "meta_parameters",
    "parameters_on_meta",
    "uninitialised_parameters",
]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on ``meta``; buffers stay real.
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


def materialize_module(model: nn.Module, device: str) -> nn.Module:
    """Give a meta-built (and possibly sharded) model storage on ``device``.

    ``to_empty`` allocates every parameter (each rank only its shard) and the
    buffers, which :func:`parameters_on_meta` kept real, are put back.
    Floating-point parameters are filled with NaN, so one that nothing loads is
    found by :func:`uninitialised_parameters` instead of training on whatever
    the allocator left in memory.

    Parameters
    ----------
    model : torch.nn.Module
        Built on the meta device (:func:`parameters_on_meta`), possibly sharded.
    device : str
        The device the storage is allocated on.

    Returns
    -------
    torch.nn.Module
        ``model`` itself, its parameters allocated and NaN-filled.
    """
    buffers = {name: b for name, b in model.named_buffers() if b.device.type != "meta"}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, saved in buffers.items():
            owner, _, leaf = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            module._buffers[leaf] = saved.to(device)
        for param in model.parameters():
            if param.is_floating_point():
                param.fill_(float("nan"))
    return model


def uninitialised_parameters(model: nn.Module) -> list[str]:
    """Names of floating-point parameters holding NaN (see :func:`materialize_module`).

    Looks at this rank's shard only; callers with a process group combine the
    answers of all ranks.

    Parameters
    ----------
    model : torch.nn.Module
        A materialized model, after its weights were loaded or initialised.

    Returns
    -------
    list of str
        The names; empty when every parameter was loaded or initialised.
    """
    from torch.distributed.tensor import DTensor

    bad = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            if local.is_floating_point() and local.numel() and torch.isnan(local).any():
                bad.append(name)
    return bad
