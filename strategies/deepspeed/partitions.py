"""A one-device run's weights into ZeRO-3's partitions during setup, one parameter at a time.

Under ``deepspeed.zero.Init`` the initialisers see empty partitions, so rank 0 records the
one-device setup and the ranks make each parameter from the record in turn, scattering
it: no rank holds more than its partitions and a parameter in flight.
"""

from __future__ import annotations

from typing import Any

import torch
from flexgraph.strategies.deepspeed.copies import allow_partitioned_copies
from torch import nn

from flexgraph.training.checkpoint import Slices

__all__ = ["PARTITIONS", "follow_init_draws", "into_partitions"]


def into_partitions(env: Any, model: nn.Module, record: Any, source_rank: int) -> None:
    """``init_weights``' placer: each parameter's one-device value into every rank's partition."""
    from flexgraph.training.runtime import return_freed_memory

    params = dict(model.named_parameters())
    turns = record.made_in_turn([[name] for name in params], source=source_rank,
                                rank=torch.distributed.get_rank(),
                                world=torch.distributed.get_world_size())
    for (name, param), (maker, made) in zip(params.items(), turns, strict=True):
        _into_partition(param, None if made is None else made[name], maker)
        del made
    return_freed_memory(None)
    allow_partitioned_copies(model)


def _partition(param: nn.Parameter) -> torch.Tensor | None:
    """This rank's flat run of ``param``'s elements; ``None`` unless over every rank."""
    partition = getattr(param, "ds_tensor", None)
    group = getattr(param, "ds_process_group", None)
    if partition is None or torch.distributed.get_world_size(group=group) != \
            torch.distributed.get_world_size():
        return None
    return partition.data[:getattr(partition, "ds_numel", partition.numel())]


def _into_partition(param: nn.Parameter, value: torch.Tensor | None, source: int = 0) -> None:
    """``source``'s whole ``value`` scattered into every rank's partition of ``param``.

    (``GatheredParameters`` with a modifier rank would all-gather the old values first.)
    """
    import deepspeed  # imported by the strategy's setup_env, told its accelerator there

    from flexgraph.training.runtime import this_rank

    part = _partition(param)
    if part is None:
        with deepspeed.zero.GatheredParameters([param], modifier_rank=source), torch.no_grad():
            if this_rank() == source:
                param.data.copy_(value)
        return
    chunks = None
    if this_rank() == source:
        flat = part.new_zeros(torch.distributed.get_world_size() * part.numel())  # padding: 0
        flat[:param.ds_numel].copy_(value.reshape(-1))
        chunks = list(flat.split(part.numel()))
    torch.distributed.scatter(part, chunks, src=source, group=param.ds_process_group)


def follow_init_draws(cfg: Any, env: Any, model: nn.Module) -> nn.Module:
    """``init_weights`` pruned: every rank's generators advance as the one-device setup's.

    A one-device run's init draws numbers its dropout then follows; where the setup cannot
    be recorded, the run warns and keeps this rank's streams.
    """
    import warnings

    from flexgraph.training.components import record_one_device_setup

    try:
        record_one_device_setup(cfg, env, load_pretrained=lambda module, path, prefix: None,
                                whole=())
    except Exception as exc:  # the weights are unaffected
        if env.rank == 0:
            warnings.warn(f"init_weights is pruned (the loaded files set every weight), and "
                          f"the one-device setup could not be recorded to draw its random "
                          f"numbers ({type(exc).__name__}: {str(exc)[:160]}); the random "
                          f"streams after setup differ from a one-device run's", stacklevel=2)
    allow_partitioned_copies(model)
    return model


def _read_own(entry: torch.Tensor, tensor: torch.Tensor, mapped: Any) -> None:
    """This rank's part of ``mapped``'s ``tensor`` into ``entry`` (a buffer whole)."""
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
"""ZeRO-3's slices for :func:`~flexgraph.training.checkpoint.load_into_slices`."""
