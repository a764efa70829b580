"""Whole values into ZeRO-3's partitions during setup, one parameter at a time.

ZeRO-3 builds the model under ``deepspeed.zero.Init``: each rank holds its
partition of every parameter, none the whole model. MMEngine's ``init_weights``
needs whole tensors (an initialiser writes a whole weight, and a parent's
``init_cfg``, ``TruncNormal`` with ``layer='Linear'`` say, reaches every
matching module below it), so :func:`init_on_rank0` runs it on rank 0 alone:

1. rank 0 collects a whole copy of the model on the host, one parameter at a
   time (each rank's partition sent to rank 0 alone, a gather): the values the
   constructors made, which ``zero.Init`` took from rank 0;
2. rank 0 runs ``init_weights`` on that copy, as one device would, drawing
   the same random numbers in the same order;
3. each parameter goes back into every rank's partition, one at a time, from
   rank 0 (a scatter: each rank receives its partition alone), and the
   buffers are broadcast from rank 0;
4. every rank ends with the random-number state a DDP rank would have: rank
   0's states, or under ``randomness.diff_rank_seed`` its own generator advanced
   by the draws rank 0 made (:func:`~flexgraph.training.runtime.follow_source_draws`).

So rank 0 holds the whole model once, on the host, while it initialises; every
other rank holds its partitions plus one gathered parameter. A model without
``init_weights`` gathers nothing.

When the files the run loads set every weight, ``init_weights`` is pruned
(a derived rewrite) and no rank holds the whole model: :func:`follow_init_draws`
advances each rank's generators as ``init_weights`` would have, drawing into
scratch tensors, and ``load_checkpoint`` (before the engine exists) puts the
file's weights into the partitions, through the one sharded load with
ZeRO-3's slices (:data:`PARTITIONS`): each rank reads only its own elements of
each parameter from the file.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
from torch import nn

from flexgraph.training.checkpoint import Slices

__all__ = ["PARTITIONS", "follow_init_draws", "init_on_rank0"]


@attrs.frozen
class _Initialised:
    """What rank 0's initialisation tells the other ranks (small; pickled to them)."""

    drawn: Any  # flexgraph.training.runtime.SourceDraws
    initialised_modules: tuple[str, ...]


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
    from flexgraph.training.runtime import broadcast_buffers, rank0_does, return_freed_memory

    if not callable(getattr(model, "init_weights", None)):
        return model
    params = list(model.parameters())
    whole = _whole_on_rank0(params)
    try:
        done = rank0_does(lambda: _initialise_whole(model, params, whole))
        for index, param in enumerate(params):
            _into_partition(param, whole[index] if whole else None)
            if whole:
                whole[index] = whole[index].new_empty(0)  # freed as it goes
    finally:
        whole.clear()
        return_freed_memory(None)
    broadcast_buffers(model)
    for name, module in model.named_modules():
        if name in done.initialised_modules:
            module._is_init = True
    _follow_rank0_rng(env, done)
    return model


def _gathered(params: list[nn.Parameter], modifier_rank: int | None = None) -> Any:
    import deepspeed  # imported by the strategy's setup_env, told its accelerator there

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


def _partition(param: nn.Parameter) -> torch.Tensor | None:
    """This rank's partition of ``param``: a flat run of its elements, as DeepSpeed
    partitions it (the last rank's padded); ``None`` where it is not partitioned over
    every rank (then it is gathered and released whole, DeepSpeed's way)."""
    partition = getattr(param, "ds_tensor", None)
    group = getattr(param, "ds_process_group", None)
    if partition is None or torch.distributed.get_world_size(group=group) != \
            torch.distributed.get_world_size():
        return None
    return partition.data[:getattr(partition, "ds_numel", partition.numel())]


def _whole_on_rank0(params: list[nn.Parameter]) -> list[torch.Tensor]:
    """Rank 0: a host copy of each parameter, its partitions gathered to rank 0 one
    parameter at a time (others: empty).

    A gather, not DeepSpeed's all-gather (``GatheredParameters``): only rank 0 needs
    the whole value, so every other rank sends its partition and receives nothing.
    """
    from flexgraph.training.runtime import this_rank

    copies = []
    world = torch.distributed.get_world_size()
    for param in params:
        part = _partition(param)
        if part is None:
            with _gathered([param]), torch.no_grad():
                if this_rank() == 0:
                    copies.append(param.data.to("cpu", copy=True))
            continue
        flat = part.new_empty(world * part.numel()) if this_rank() == 0 else None
        torch.distributed.gather(part, None if flat is None else list(flat.split(part.numel())),
                                 dst=0, group=param.ds_process_group)
        if flat is not None:
            copies.append(flat[:param.ds_numel].view(param.ds_shape).to("cpu"))
    return copies


def _initialise_whole(model: nn.Module, params: list[nn.Parameter],
                      whole: list[torch.Tensor]) -> _Initialised:
    """Rank 0: ``init_weights`` with each parameter's data its whole copy; ``whole`` updated."""
    from flexgraph.training.checkpoint import load_pretrained
    from flexgraph.training.components import initialise
    from flexgraph.training.errors import ConfigError
    from flexgraph.training.runtime import drawn_by

    placeholders = [param.data for param in params]
    try:
        for param, value in zip(params, whole, strict=True):
            param.data = value
        _, drawn = drawn_by(lambda: initialise(model, load_pretrained=load_pretrained))
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
    return _Initialised(drawn=drawn,
                        initialised_modules=tuple(name for name, m in model.named_modules()
                                                  if getattr(m, "_is_init", False)))


def _into_partition(param: nn.Parameter, value: torch.Tensor | None) -> None:
    """Rank 0's whole ``value`` (``None`` elsewhere) into every rank's partition of
    ``param``: a scatter, each rank receiving its own partition (``GatheredParameters``
    with a modifier rank would all-gather the old values first, then broadcast the whole)."""
    from flexgraph.training.runtime import this_rank

    part = _partition(param)
    if part is None:
        with _gathered([param], modifier_rank=0), torch.no_grad():
            if this_rank() == 0:
                param.data.copy_(value)
        return
    chunks = None
    if this_rank() == 0:
        flat = part.new_zeros(torch.distributed.get_world_size() * part.numel())  # padding: 0
        flat[:param.ds_numel].copy_(value.reshape(-1))
        chunks = list(flat.split(part.numel()))
    torch.distributed.scatter(part, chunks, src=0, group=param.ds_process_group)


def _follow_rank0_rng(env: Any, done: _Initialised) -> None:
    """Every rank's generators where a DDP rank's would be after ``init_weights``."""
    from flexgraph.training.runtime import follow_source_draws

    if env.rank != 0:
        follow_source_draws(done.drawn, diff_rank_seed=env.diff_rank_seed, warn=env.rank == 1)


def follow_init_draws(env: Any, model: nn.Module) -> nn.Module:
    """``init_weights`` pruned: every rank's generators advance as it would advance them.

    The loaded files set every weight, so nothing is initialised; but a
    one-device run initialises before it loads, drawing random numbers that
    training's dropout then follows. Each rank runs ``init_weights`` on
    parameters without values (:func:`~flexgraph.training.runtime.parameters_without_values`),
    each random draw made into a scratch tensor of its shape, one at a time,
    its ``Pretrained`` files not read (``load_checkpoint`` loads them). No
    parameter is touched. Where ``init_weights`` cannot run without values (it
    reads one to decide what to do), the run goes on with a warning: the
    weights are the files', the random streams this rank's seed's.
    """
    import warnings

    from flexgraph.training.components import initialise
    from flexgraph.training.runtime import parameters_without_values

    if not callable(getattr(model, "init_weights", None)):
        return model
    try:
        with parameters_without_values(model, shape_of=lambda p: getattr(p, "ds_shape",
                                                                         p.shape)):
            initialise(model, load_pretrained=lambda module, path, prefix: None)
    except Exception as exc:  # an initialiser that needs values: the weights are unaffected
        if env.rank == 0:
            warnings.warn(f"init_weights is pruned (the loaded files set every weight), and "
                          f"it could not run without values to draw its random numbers "
                          f"({type(exc).__name__}: {str(exc)[:160]}); the random streams "
                          f"after setup differ from a one-device run's", stacklevel=2)
    return model


def _read_own(entry: torch.Tensor, tensor: torch.Tensor, mapped: Any) -> None:
    """This rank's part of ``tensor`` (a value of ``mapped``'s checkpoint) into ``entry``:
    its partition of a parameter, a buffer whole."""
    if not hasattr(entry, "ds_tensor"):
        mapped.read_rows(tensor, 0, entry.shape[0] if entry.dim() else 1, entry)
        return
    partition = entry.ds_tensor
    size = getattr(partition, "ds_numel", partition.numel())
    start = size * torch.distributed.get_rank(group=entry.ds_process_group)
    stop = min(start + size, entry.ds_numel)
    if start >= stop:
        return
    if tensor.dim() <= 1:
        mapped.read_rows(tensor, start, stop, partition.data[:stop - start].view(-1)
                         if tensor.dim() else partition.data[:1].view(()))
        return
    # the rows that hold the run, read from the file, then cut to it (at most two rows more)
    row = tensor[0].numel()
    first, last = start // row, -(-stop // row)
    rows = torch.empty((last - first, *tensor.shape[1:]), dtype=partition.dtype)
    mapped.read_rows(tensor, first, last, rows)
    partition.data[:stop - start].copy_(rows.view(-1)[start - first * row:stop - first * row])


def _receive(entry: torch.Tensor, value: torch.Tensor | None) -> None:
    """Rank 0's whole ``value`` into every rank's part of ``entry`` (a collective)."""
    from flexgraph.training.runtime import this_rank

    if hasattr(entry, "ds_tensor"):
        _into_partition(entry, value)
        return
    if this_rank() == 0:
        entry.copy_(value)
    torch.distributed.broadcast(entry, src=0)


PARTITIONS = Slices(read_own=_read_own, receive=_receive,
                    whole_shape=lambda entry: tuple(getattr(entry, "ds_shape", entry.shape)))
"""ZeRO-3's slices, for the one sharded ``load_from``
(:func:`~flexgraph.training.checkpoint.load_into_slices`): a parameter's partition
is a flat run of its elements (``ds_tensor``; the rows that hold it are read from
the file, or it is scattered from rank 0's whole value); a buffer is held whole."""
