"""Joining a torch.distributed process group: the ``setup_env`` of every multi-process strategy.

Processes are launched by ``torch.distributed.run`` (``flexgraph run
--nproc-per-node N`` or ``torchrun``), which sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address; a process started without it is a
world of one. DDP, FSDP and DeepSpeed all replace ``setup_env`` with
:func:`setup_process_group`, each with its own ``dist_cfg``.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from flexgraph.training.runtime._env import Env, make_env

__all__ = ["setup_process_group"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_device_index(local_rank: int, visible: int) -> int:
    """This rank's accelerator among the ``visible`` ones (``CUDA_VISIBLE_DEVICES``).

    A launcher that shows each rank every device of its node (torchrun) leaves
    the choice to the local rank; a scheduler that binds one device to each task
    (SLURM's ``--gpus-per-task=1``, ``--gpu-bind``) shows it only that one.

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


def setup_process_group(
    cfg: Any, *, device: str | None = None, backend: str | None = None, timeout: float = 1800
) -> Env:
    """Join (or create) the process group from torchrun's environment variables.

    ``backend`` defaults to NCCL on CUDA and gloo on the CPU; ``timeout`` is in
    seconds (mmengine's ``dist_cfg`` keys).

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config (its ``randomness`` and ``env_cfg`` make the ``Env``).
    device : str, optional
        The device to train on; CUDA when available (this rank's GPU), else the
        CPU.
    backend : str, optional
        The process group's backend: NCCL on CUDA, gloo on the CPU by default.
    timeout : float, default 1800
        Seconds a collective may wait (mmengine's ``dist_cfg`` key).

    Returns
    -------
    Env
        This rank's environment: device, rank, world size, seeds.
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
        dist.init_process_group(
            backend or ("nccl" if device.startswith("cuda") else "gloo"),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
    return make_env(cfg, device=device, rank=rank, world_size=world_size, local_rank=local_rank)


def leave_process_group() -> None:
    """Destroy the process group a run joined, once every rank has finished.

    Left to interpreter exit, the communicator's threads are torn down in no
    particular order with the rest of the process, and a rank can abort there
    after its training completed.
    """
    import torch.distributed as dist

    from flexgraph.training.runtime._group import group_is_up

    if group_is_up():
        dist.barrier()
        dist.destroy_process_group()
