"""The process group, asked of torch.distributed itself, for code without an ``Env``.

Without a group this process is rank 0 of 1 and every collective here is a
no-op; with one, every rank must call a collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


def group_is_up() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def this_rank() -> int:
    """This process's global rank (0 without a process group).

    Returns
    -------
    int
    """
    return torch.distributed.get_rank() if group_is_up() else 0


def world_size() -> int:
    """How many processes the group has (1 without one).

    Returns
    -------
    int
    """
    return torch.distributed.get_world_size() if group_is_up() else 1


def launch_rank() -> int:
    """The rank the launcher gave this process (``RANK``), before or without a group.

    Returns
    -------
    int
    """
    return this_rank() if group_is_up() else int(os.environ.get("RANK", "0"))


def launch_world_size() -> int:
    """The world size the launcher set (``WORLD_SIZE``), before or without a group.

    Returns
    -------
    int
    """
    return world_size() if group_is_up() else int(os.environ.get("WORLD_SIZE", "1"))


def barrier() -> None:
    """Wait for every rank (nothing to wait for without a group)."""
    if group_is_up():
        torch.distributed.barrier()


def broadcast_from_rank0(obj: T, *, rank: int = 0) -> T:
    """Rank 0's (or ``rank``'s) picklable ``obj`` on every rank.

    Parameters
    ----------
    obj : Any
    rank : int, default 0

    Returns
    -------
    Any
    """
    if world_size() == 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=rank)
    return box[0]


def gathered_from_every_rank(obj: T) -> list[T]:
    """Every rank's picklable ``obj``, in rank order.

    Parameters
    ----------
    obj : Any

    Returns
    -------
    list
    """
    if world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(gathered, obj)
    return gathered


def rank0_does(action: Callable[[], T], *, share_result: bool = True,
               rank: int = 0) -> T | None:
    """Run ``action`` on rank 0 (or ``rank``); every rank gets its result, or its exception
    (a rank that never learned of it would wait in the next collective forever).

    Parameters
    ----------
    action : callable
    share_result : bool
        ``False``: the other ranks get ``None`` (a large result stays put).
    rank : int

    Returns
    -------
    Any
    """
    result: T | None = None
    error: BaseException | None = None
    if this_rank() == rank:
        try:
            result = action()
        except Exception as exc:  # every rank must learn it, or the others wait forever
            error = exc
    if world_size() == 1:
        if error is not None:
            raise error
        return result
    error, shared = broadcast_from_rank0((error, result if share_result else None), rank=rank)
    if error is not None:
        raise error
    return result if this_rank() == rank else shared


def first_error_of_all_ranks(error: E | None, *, kind: Callable[[str], E]) -> E | None:
    """This rank's own error, else the lowest failing rank's message as ``kind``, else ``None``:
    the ranks agree, so none goes on to a collective the others skip.

    Parameters
    ----------
    error : Exception or None
    kind : callable
        Makes an error from a message.

    Returns
    -------
    Exception or None
    """
    if world_size() == 1:
        return error
    messages = gathered_from_every_rank(None if error is None else str(error))
    first = next((m for m in messages if m is not None), None)
    if first is None:
        return None
    return error if error is not None and str(error) == first else kind(first)


def agreed(action: Callable[[], T], *, kind: type[E]) -> T | None:
    """``action()`` on every rank; the lowest rank's ``kind`` error raised on all of them (a
    collective); an error not of ``kind`` is raised at once.

    Parameters
    ----------
    action : callable
    kind : type of Exception

    Returns
    -------
    Any
        ``action``'s result on this rank.
    """
    result, error = None, None
    try:
        result = action()
    except kind as exc:
        error = exc
    error = first_error_of_all_ranks(error, kind=kind)
    if error is not None:
        raise error
    return result


def broadcast_buffers(model: torch.nn.Module, *, rank: int = 0) -> None:
    """Rank 0's buffers (or ``rank``'s) on every rank; a collective.

    Parameters
    ----------
    model : torch.nn.Module
    rank : int, default 0
    """
    if world_size() == 1:
        return
    with torch.no_grad():
        for buffer in model.buffers():
            torch.distributed.broadcast(buffer, src=rank)
