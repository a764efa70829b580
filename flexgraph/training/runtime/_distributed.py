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


FLIGHT_RECORDER_ENTRIES = "2000"
"""Collectives NCCL's flight recorder keeps per process group, by default (torchtitan's order
of magnitude): the last ones each rank issued, dumped when a collective times out."""
_NCCL_DEFAULTS = {
    # A collective that timed out ends the process without tearing the communicator down
    # (torch's "SkipCleanUp"; a cleanup can hang on a broken NCCL communicator).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": FLIGHT_RECORDER_ENTRIES,
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


def _watched_timeout(cfg: Any, timeout: float | None) -> float:
    """The process group's timeout: ``dist_cfg.timeout`` as given, else one derived from the
    watchdog's limits (``env_cfg.stall_timeout``), which then always reports first.

    A given timeout shorter than the watchdog's longest limit is kept, and a warning says
    what follows: a stall longer than it ends in a collective's timeout error, which names
    no stuck rank.
    """
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

    ``backend`` defaults to NCCL on CUDA and gloo on the CPU; ``timeout`` is in
    seconds (mmengine's ``dist_cfg`` keys). Without a ``timeout`` the group's is
    derived from the watchdog's limits (``env_cfg.stall_timeout``, see
    :func:`~flexgraph.training.config.collective_timeout`): the watchdog, which
    names the rank that made no progress, reports before a collective times out.
    On NCCL, unless the environment says otherwise, a collective that times out
    ends the process (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``) and NCCL's flight
    recorder keeps the last collectives and dumps them then
    (``TORCH_NCCL_TRACE_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT``; where to:
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, which ``flexgraph run`` points into the
    run's watch folder).

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config (its ``randomness`` and ``env_cfg`` make the ``Env``;
        its ``env_cfg.stall_timeout`` the group's timeout when none is given).
    device : str, optional
        The device to train on; CUDA when available (this rank's GPU), else the
        CPU.
    backend : str, optional
        The process group's backend: NCCL on CUDA, gloo on the CPU by default.
    timeout : float, optional
        Seconds a collective may wait (mmengine's ``dist_cfg`` key); by default
        longer than every limit of the watchdog, 1800 without one.

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
