"""Joining a torch.distributed process group from ``torch.distributed.run``'s variables."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from flexgraph.training.runtime._env import Env, make_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_device_index(local_rank: int, visible: int) -> int:
    """This rank's accelerator among the ``visible`` ones: torchrun shows each rank every
    device of its node, a scheduler that binds one device per task only that one.

    Examples
    --------
    >>> visible_device_index(3, 8), visible_device_index(3, 1)
    (3, 0)
    """
    if local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    from flexgraph.training.errors import ConfigError

    raise ConfigError(f"local rank {local_rank} has no accelerator of its own: {visible} are "
                      f"visible (CUDA_VISIBLE_DEVICES); start at most {visible} ranks per "
                      f"node, or bind one device to each task")


_NCCL_DEFAULTS = {
    # end the process without tearing the communicator down: that cleanup can hang
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # collectives kept per group, dumped on a timeout
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


def _watched_timeout(cfg: Any, timeout: float | None) -> float:
    """``dist_cfg.timeout`` as given (warned about when shorter than the watchdog's
    limits), else one longer than them, so the watchdog reports a stall first."""
    from flexgraph.training.config import collective_timeout, watch_policy

    policy = watch_policy(cfg)
    if timeout is None:
        return collective_timeout(policy)
    longest = collective_timeout(policy)
    if policy.enabled and timeout < longest:
        import warnings

        warnings.warn(
            f"dist_cfg.timeout={timeout:g} s is shorter than the watchdog's limits "
            f"(env_cfg.stall_timeout; up to {longest:g} s for setup steps, first iterations, "
            f"evaluations and saves): a rank waiting that long in a collective fails with "
            f"torch's timeout error, which names no stuck rank; leave dist_cfg.timeout "
            f"unset to have it derived", stacklevel=3)
    return float(timeout)


def setup_process_group(
    cfg: Any, *, device: str | None = None, backend: str | None = None,
    timeout: float | None = None
) -> Env:
    """Join (or create) the process group from torchrun's environment variables.

    Parameters
    ----------
    cfg : Config or Mapping
    device : str, optional
        Default: this rank's GPU when CUDA is available, else the CPU.
    backend : str, optional
        Default: NCCL on CUDA, gloo on the CPU.
    timeout : float, optional
        Seconds a collective may wait (``dist_cfg.timeout``).

    Returns
    -------
    Env
    """
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if "MASTER_ADDR" not in os.environ:  # not under torchrun: a world of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        index = visible_device_index(local_rank, torch.cuda.device_count())
        device = f"cuda:{index}"
        torch.cuda.set_device(index)
    if not dist.is_initialized():
        backend = backend or ("nccl" if device.startswith("cuda") else "gloo")
        if "nccl" in backend:  # read by ProcessGroupNCCL as it is made
            for name, value in _NCCL_DEFAULTS.items():
                os.environ.setdefault(name, value)
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=_watched_timeout(cfg, timeout)),
        )
    return make_env(cfg, device=device, rank=rank, world_size=world_size, local_rank=local_rank)


def leave_process_group() -> None:
    """Destroy the process group once every rank has finished (at exit it can abort one)."""
    import torch.distributed as dist

    from flexgraph.training.runtime._group import group_is_up

    if group_is_up():
        dist.barrier()
        dist.destroy_process_group()
