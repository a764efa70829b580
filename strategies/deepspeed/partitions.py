"""Whole values into ZeRO-3's partitions during setup, one parameter at a time.

ZeRO-3 builds the model under ``deepspeed.zero.Init``: each rank holds its
partition of every parameter, none the whole model. MMEngine's ``init_weights``
needs whole tensors (an initialiser writes a whole weight, and a parent's
``init_cfg``, ``TruncNormal`` with ``layer='Linear'`` say, reaches every
matching module below it), so :func:`init_on_rank0` runs it on rank 0 alone:

1. rank 0 collects a whole copy of the model on the host, one parameter at a
   time (each gathered, copied, released): the values the constructors made,
   which ``zero.Init`` took from rank 0;
2. rank 0 runs ``init_weights`` on that copy, as one device would, drawing
   the same random numbers in the same order;
3. each parameter goes back into every rank's partition, one at a time, from
   rank 0 (``GatheredParameters(modifier_rank=0)``), and the buffers are
   broadcast from rank 0;
4. every rank ends with the random-number state a DDP rank would have: rank
   0's states, or under ``randomness.diff_rank_seed`` its own generator advanced
   by the draws rank 0 made (:func:`~flexgraph.training.runtime.replay_draws`).

So rank 0 holds the whole model once, on the host, while it initialises; every
other rank holds its partitions plus one gathered parameter. A model without
``init_weights`` gathers nothing.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

__all__ = ["init_on_rank0"]


@attrs.frozen
class _Initialised:
    """What rank 0's initialisation tells the other ranks (small; pickled to them)."""

    draws: list[Any]
    rng: dict[str, Any]
    initialised_modules: tuple[str, ...]
    host_draws: bool


def init_on_rank0(env: Any, model: nn.Module) -> nn.Module:
    """``model.init_weights()`` on rank 0's whole copy, then into every rank's partitions.

    See the module docstring for the steps. Errors of the initialisers (and a
    ``Pretrained`` checkpoint that does not load) are raised on every rank.

    Raises
    ------
    ConfigError
        ``init_weights`` added or replaced a parameter (it cannot be partitioned
        the way the others were).
    InitWeightsError, CheckpointError
        From the initialisers, as a one-device run raises them.
    """
    from flexgraph.training.runtime import rank0_does, return_freed_memory

    if not callable(getattr(model, "init_weights", None)):
        return model
    params = list(model.parameters())
    whole = _whole_on_rank0(params)
    try:
        done = rank0_does(lambda: _initialise_whole(model, params, whole))
        _into_partitions(params, whole)
    finally:
        whole.clear()
        return_freed_memory(None)
    _broadcast_buffers(model)
    for name, module in model.named_modules():
        if name in done.initialised_modules:
            module._is_init = True
    _follow_rank0_rng(env, done)
    return model


def _gathered(params: list[nn.Parameter], modifier_rank: int | None = None) -> Any:
    from flexgraph.strategies.deepspeed.steps import _import_deepspeed

    return _import_deepspeed().zero.GatheredParameters(params, modifier_rank=modifier_rank)


def _whole_on_rank0(params: list[nn.Parameter]) -> list[torch.Tensor]:
    """Rank 0: a host copy of each parameter, gathered one at a time (others: empty)."""
    from flexgraph.training.runtime import this_rank

    copies = []
    for param in params:
        with _gathered([param]), torch.no_grad():
            if this_rank() == 0:
                copies.append(param.data.to("cpu", copy=True))
    return copies


def _initialise_whole(model: nn.Module, params: list[nn.Parameter],
                      whole: list[torch.Tensor]) -> _Initialised:
    """Rank 0: ``init_weights`` with each parameter's data its whole copy; ``whole`` updated."""
    from flexgraph.training.checkpoint import load_pretrained
    from flexgraph.training.components import initialise
    from flexgraph.training.errors import ConfigError
    from flexgraph.training.runtime import capture_rng, host_generators_moved, recording_draws

    placeholders = [param.data for param in params]
    before = capture_rng()
    try:
        for param, value in zip(params, whole, strict=True):
            param.data = value
        with recording_draws() as draws:
            initialise(model, load_pretrained=lambda module, path, prefix: load_pretrained(
                module, path, prefix, in_this_process=True))
        whole[:] = [param.data for param in params]
    finally:
        for param, placeholder in zip(params, placeholders, strict=True):
            param.data = placeholder
    known = {id(p) for p in params}
    added = [name for name, p in model.named_parameters() if id(p) not in known]
    if added:
        raise ConfigError(
            f"init_weights added or replaced parameter {added[0]!r}"
            f"{f' and {len(added) - 1} more' if len(added) > 1 else ''}; under ZeRO-3 the "
            f"parameters are partitioned as the model is built, so init_weights must write "
            f"into them (nn.init.*_(module.weight), weight.data.copy_(...)) rather than assign "
            f"new ones")
    return _Initialised(draws=draws, rng=capture_rng(),
                        initialised_modules=tuple(name for name, m in model.named_modules()
                                                  if getattr(m, "_is_init", False)),
                        host_draws=host_generators_moved(before))


def _into_partitions(params: list[nn.Parameter], whole: list[torch.Tensor]) -> None:
    """Rank 0's ``whole`` values into every rank's partitions, one parameter at a time."""
    from flexgraph.training.runtime import this_rank

    for index, param in enumerate(params):
        with _gathered([param], modifier_rank=0), torch.no_grad():
            if this_rank() == 0:
                param.data.copy_(whole[index])
                whole[index] = whole[index].new_empty(0)  # freed as it goes


def _broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's buffers on every rank (ZeRO-3 keeps them whole; init_weights may set them)."""
    for buffer in model.buffers():
        carried = buffer.data if buffer.dtype != torch.bool else buffer.data.to(torch.uint8)
        torch.distributed.broadcast(carried, src=0)
        if carried is not buffer.data:
            buffer.data.copy_(carried)


def _follow_rank0_rng(env: Any, done: _Initialised) -> None:
    """Every rank's generators where a DDP rank's would be after ``init_weights``."""
    from flexgraph.training.runtime import replay_draws, restore_rng

    if env.rank == 0:
        return
    if not env.diff_rank_seed:
        restore_rng(done.rng)
        return
    replay_draws(done.draws)
    if done.host_draws and env.rank == 1:
        import warnings

        warnings.warn("init_weights drew from Python's or numpy's random generator on rank 0; "
                      "under randomness.diff_rank_seed the other ranks' generators of those "
                      "were not advanced as a DDP run's would be", stacklevel=2)
