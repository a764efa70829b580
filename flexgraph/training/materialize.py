"""Models whose parameters do not exist yet: built on the meta device, filled in later.

A sharding strategy must never let one rank hold the whole model, so it builds
the model with its parameters on PyTorch's ``meta`` device (shapes, no storage),
shards it, and only then gives each rank storage for its own shard and
initialises or loads it. This module holds the pieces of that path that are not
specific to any strategy:

* :func:`parameters_on_meta`: build with parameters on ``meta`` but buffers
  real. Parameters are large and re-initialised after sharding anyway; buffers
  are small and often *computed* in ``__init__`` (positional tables, BatchNorm
  statistics), with no method that could recompute them later, so they keep
  their values. The tensors ``nn.Module``s create for their parameters come from
  ``torch.empty`` and are moved to ``meta`` as they are registered, before any
  initialiser writes to them, so the build costs neither memory nor init time
  (the same approach as accelerate's ``init_empty_weights(include_buffers=False)``).
* :func:`independent_shard_rng`: where torch cannot coordinate random draws
  across the shards of a parameter (it can on CUDA, not on CPU meshes), every
  rank would draw the same numbers for its shard and the full tensor would
  repeat itself; each rank draws from its own stream for the duration instead.
* :func:`meta_parameters`: names of parameters that still have no storage, so
  that a loader can refuse such a model instead of silently loading nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = [
    "independent_shard_rng",
    "materialize_module",
    "meta_parameters",
    "parameters_on_meta",
    "uninitialised_parameters",
]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on ``meta``; buffers stay real."""
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
    """Names of ``model``'s parameters and buffers that live on the meta device."""
    return [name for name, t in [*model.named_parameters(), *model.named_buffers()]
            if t.device.type == "meta"]


def _uncoordinated_shards(model: nn.Module) -> bool:
    """Whether ``model`` has DTensor parameters on a mesh torch cannot seed jointly."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._random import is_rng_supported_mesh

    for param in model.parameters():
        if isinstance(param, DTensor):
            import warnings

            with warnings.catch_warnings():  # the probe itself warns on CPU meshes
                warnings.simplefilter("ignore")
                return not is_rng_supported_mesh(param.device_mesh)
    return False


@contextlib.contextmanager
def independent_shard_rng(model: nn.Module, rank: int) -> Iterator[None]:
    """Initialise sharded parameters with draws that differ between shards.

    Only where needed (see the module docstring); the global RNG state is put
    back afterwards, so training draws are the same as without sharding.
    """
    if not _uncoordinated_shards(model):
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch.initial_seed() + 7919 * (rank + 1))
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "DTensor random operators")
            yield


def materialize_module(model: nn.Module, device: str, *, reset_parameters: bool = True,
                       rank: int = 0) -> nn.Module:
    """Give a meta-built (and possibly sharded) model storage on ``device``.

    ``to_empty`` allocates every parameter (each rank only its shard); the
    buffers, which :func:`parameters_on_meta` kept real, are put back; then
    every module's own ``reset_parameters()`` redoes the initialisation its
    constructor did on the meta device, as an unsharded build would have (the
    model's ``init_weights``, when it has one, runs after this, as it does after
    construction). Floating-point parameters are filled with NaN first, so one
    that nothing initialises is found by :func:`uninitialised_parameters`
    instead of training on garbage memory.
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
        if reset_parameters:
            with independent_shard_rng(model, rank):
                for module in model.modules():
                    # torch's attention modules call theirs _reset_parameters
                    reset = getattr(module, "reset_parameters", None) or getattr(
                        module, "_reset_parameters", None)
                    if callable(reset):
                        reset()
    return model


def uninitialised_parameters(model: nn.Module) -> list[str]:
    """Names of floating-point parameters holding NaN (see :func:`materialize_module`).

    Looks at this rank's shard only; callers with a process group combine the
    answers of all ranks.
    """
    from torch.distributed.tensor import DTensor

    bad = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if isinstance(param, DTensor) else param
            if local.is_floating_point() and local.numel() and torch.isnan(local).any():
                bad.append(name)
    return bad
