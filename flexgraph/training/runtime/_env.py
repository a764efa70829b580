"""The process's place in the run (device, rank, world size) and its seeding.

Seeding follows MMEngine's ``randomness``: ``Env.seed`` is the base seed shared
by all ranks (samplers must shuffle alike), and under ``diff_rank_seed`` the
global RNGs get ``seed + rank`` so that dropout and augmentations differ.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import attrs
import numpy as np
import torch

from flexgraph.training.config import section
from flexgraph.training.errors import ConfigError
from flexgraph.training.runtime._group import broadcast_from_rank0


@attrs.frozen
class Env:
    """Where this process trains: the ``env`` artifact.

    Parameters
    ----------
    device : str
    rank, world_size, local_rank : int
    seed : int
        The run's base seed, the same on every rank.
    diff_rank_seed : bool
        Whether the global RNGs were seeded with :attr:`rank_seed`.
    """

    device: str = "cpu"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    seed: int = 0
    diff_rank_seed: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def rank_seed(self) -> int:
        """The seed of this rank's global RNGs (MMEngine's ``runner.seed``)."""
        return rank_seed(self.seed, self.rank, self.diff_rank_seed)


def rank_seed(seed: int, rank: int, diff_rank_seed: bool) -> int:
    """``seed + rank`` under ``diff_rank_seed`` (MMEngine's ``set_random_seed``), else ``seed``.

    Parameters
    ----------
    seed, rank : int
    diff_rank_seed : bool

    Returns
    -------
    int
    """
    return seed + rank if diff_rank_seed else seed


def _random_seed() -> int:
    """A fresh seed, identical on all ranks when a process group exists."""
    return int(broadcast_from_rank0(int(np.random.default_rng().integers(2**31))))


def seed_everything(randomness: Any = None, rank: int = 0) -> int:
    """Seed python, numpy, torch and CUDA as ``randomness`` asks.

    Parameters
    ----------
    randomness : mapping, optional
        MMEngine's ``randomness``; a ``seed`` of ``None`` picks one shared by all ranks.
    rank : int, optional

    Returns
    -------
    int
        The base seed, without the rank's offset.
    """
    randomness = dict(randomness or {})
    seed = randomness.get("seed")
    seed = _random_seed() if seed is None else int(seed)
    rng_seed = rank_seed(seed, rank, bool(randomness.get("diff_rank_seed", False)))
    random.seed(rng_seed)
    np.random.seed(rng_seed % 2**32)
    torch.manual_seed(rng_seed)  # also seeds every CUDA device
    if randomness.get("deterministic", False):
        # cuBLAS is deterministic only with a fixed workspace, set before any kernel runs
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return seed


DEFAULT_MMAP_THRESHOLD = 4 * 1024 * 1024


def return_freed_memory(threshold: int | None) -> bool:
    """Have glibc give freed blocks of ``threshold`` bytes and more back to the OS at once.

    glibc raises its mmap threshold as large blocks are freed, after which the
    weights a sharded strategy gathers and frees each iteration stay resident.

    Parameters
    ----------
    threshold : int or None
        ``0`` or ``None`` keeps glibc's behaviour.

    Returns
    -------
    bool
        Whether it was applied (glibc only).
    """
    if not threshold or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # another C library (musl): nothing to set
        return False
    m_mmap_threshold = -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, int(threshold)))


def _resolve_device(device: str | None, local_rank: int) -> str:
    if device is None:
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r} was requested but torch sees no CUDA device; "
            f"use device='cpu' or run on a machine with a GPU"
        )
    return str(device)


def use_default_scope(cfg: Any) -> None:
    """``cfg.default_scope`` as MMEngine's default registry scope, so short names resolve.

    Parameters
    ----------
    cfg : Config or Mapping
    """
    scope = section(cfg, "default_scope")
    if scope:
        from mmengine.registry import DefaultScope

        if DefaultScope.get_current_instance() is None or (
            DefaultScope.get_current_instance().scope_name != scope
        ):
            DefaultScope.get_instance(f"flexgraph-{scope}-{id(cfg)}", scope_name=scope)


def make_env(
    cfg: Any,
    device: str | None = None,
    rank: int = 0,
    world_size: int = 1,
    local_rank: int = 0,
) -> Env:
    """Seed this process and describe it; after the process group is up (``seed=None``).

    Parameters
    ----------
    cfg : mmengine.Config or mapping
    device : str, optional
        Default: ``cuda:<local_rank>`` when torch sees CUDA, else ``'cpu'``.
    rank, world_size, local_rank : int, optional

    Returns
    -------
    Env
    """
    resolved = _resolve_device(device, local_rank)
    if resolved.startswith("cuda:"):
        torch.cuda.set_device(torch.device(resolved))
    env_cfg = section(cfg, "env_cfg", {})
    if env_cfg.get("cudnn_benchmark") is not None:
        torch.backends.cudnn.benchmark = bool(env_cfg["cudnn_benchmark"])
    if resolved == "cpu":  # one process shards nothing: glibc's own threshold (0) suits it
        return_freed_memory(env_cfg.get("malloc_mmap_threshold",
                                        DEFAULT_MMAP_THRESHOLD if world_size > 1 else 0))
    use_default_scope(cfg)
    randomness = section(cfg, "randomness", {})
    seed = seed_everything(randomness, rank)
    return Env(device=resolved, rank=rank, world_size=world_size, local_rank=local_rank,
               seed=seed, diff_rank_seed=bool(randomness.get("diff_rank_seed", False)))
