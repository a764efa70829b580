"""The process's place in the run (device, rank, world size) and its seeding.

:class:`Env` is what every later step reads to learn where it runs. It is a
frozen value, built once by :func:`make_env`: the single-device ``setup_env`` step
calls it for rank 0 of 1, and a distributed strategy calls it after it has
initialised the process group, so no step ever needs to know which strategy set
the process up.

Seeding follows MMEngine's ``randomness`` section and ``set_random_seed``.
``Env.seed`` is the *base* seed shared by all ranks (checkpoints record it, and
samplers must shuffle identically on every rank and then take their own
slice); with ``diff_rank_seed=True`` the global RNGs get ``seed + rank``
(:attr:`Env.rank_seed`, MMEngine's ``runner.seed``) so that dropout and
augmentations differ between ranks. The dataloaders derive their sampler and
worker seeds from these two exactly as MMEngine's Runner does
(:mod:`flexgraph.training.components._data`).
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

__all__ = ["Env", "default_mmap_threshold", "make_env", "rank_seed", "return_freed_memory",
           "seed_everything"]


@attrs.frozen
class Env:
    """Where this process trains: the ``env`` artifact every later step reads.

    A frozen value: :func:`make_env` builds it once per run, after seeding.

    Parameters
    ----------
    device : str
        ``'cpu'``, ``'cuda'`` or ``'cuda:<local_rank>'``; the model and batches go here.
    rank, world_size, local_rank : int
        This process's place among all training processes (0, 1, 0 when alone).
    seed : int
        Base seed of the run (the same on every rank); samplers derive their
        per-epoch order from it, checkpoints record it.
    diff_rank_seed : bool
        ``randomness.diff_rank_seed``: the global RNGs were seeded with
        :attr:`rank_seed`, and samplers draw their seed instead of taking it.

    Examples
    --------
    >>> Env(rank=1, world_size=2, seed=3, diff_rank_seed=True).rank_seed
    4
    """

    device: str = "cpu"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    seed: int = 0
    diff_rank_seed: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files and prints; the others stay quiet."""
        return self.rank == 0

    @property
    def rank_seed(self) -> int:
        """The seed of this rank's global RNGs: what MMEngine calls ``runner.seed``.

        MMEngine's Runner also seeds the dataloader workers from it, so it is
        ``seed + rank`` under ``diff_rank_seed`` and ``seed`` otherwise.
        """
        return rank_seed(self.seed, self.rank, self.diff_rank_seed)


def rank_seed(seed: int, rank: int, diff_rank_seed: bool) -> int:
    """``seed + rank`` under ``diff_rank_seed`` (MMEngine's ``set_random_seed``), else ``seed``.

    Parameters
    ----------
    seed : int
        The run's base seed.
    rank : int
        This process's rank.
    diff_rank_seed : bool
        MMEngine's ``randomness.diff_rank_seed``.

    Returns
    -------
    int
        This rank's seed.
    """
    return seed + rank if diff_rank_seed else seed


def _random_seed() -> int:
    """A fresh seed, identical on all ranks when a process group exists."""
    return int(broadcast_from_rank0(int(np.random.default_rng().integers(2**31))))


def seed_everything(randomness: Any = None, rank: int = 0) -> int:
    """Seed python, numpy and torch (and CUDA) as ``randomness`` asks.

    Parameters
    ----------
    randomness : mapping, optional
        MMEngine's ``randomness`` dict: ``seed`` (``None`` picks one and shares it
        across ranks), ``deterministic`` (use deterministic algorithms, which can
        be slower), ``diff_rank_seed`` (offset the global RNGs by ``rank``).
    rank : int, optional
        This process's global rank.

    Returns
    -------
    int
        The base seed (without the rank offset), to record in :class:`Env`.
    """
    randomness = dict(randomness or {})
    seed = randomness.get("seed")
    seed = _random_seed() if seed is None else int(seed)
    rng_seed = rank_seed(seed, rank, bool(randomness.get("diff_rank_seed", False)))
    random.seed(rng_seed)
    np.random.seed(rng_seed % 2**32)
    torch.manual_seed(rng_seed)  # also seeds every CUDA device
    if randomness.get("deterministic", False):
        # cuBLAS needs a fixed workspace to be deterministic; set it before any
        # CUDA kernel runs, and only when the user has not chosen one.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return seed


DEFAULT_MMAP_THRESHOLD = 4 * 1024 * 1024


def return_freed_memory(threshold: int | None) -> bool:
    """Have glibc give freed blocks of ``threshold`` bytes and more back to the OS at once.

    On the CPU, tensors live in memory from the C allocator. glibc serves blocks
    from 128 KiB up with mmap, but raises that threshold (up to 32 MiB) each time
    such a block is freed, after which freed blocks below it stay in the
    process. Sharded strategies gather a block's weights and free them again
    every iteration, so with glibc's adaptive threshold those buffers stay
    resident and the memory sharding saves is not given back. A fixed threshold
    costs a page fault per fresh page of such a buffer.

    Parameters
    ----------
    threshold : int or None
        ``env_cfg.malloc_mmap_threshold`` (by default :func:`default_mmap_threshold`);
        ``0`` or ``None`` keeps glibc's behaviour.

    Returns
    -------
    bool
        Whether the setting was applied (glibc only).
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


def default_mmap_threshold(world_size: int) -> int:
    """The threshold a CPU run gets without ``env_cfg.malloc_mmap_threshold``.

    4 MiB for a run of several processes, which a strategy may shard, and ``0``
    (glibc's adaptive threshold, as in a hand-written script) for a single one:
    a process alone shards nothing, so a fixed threshold only costs it. Every
    block of 4 MiB and more (a 1024 x 1024 weight's gradient, AdamW's
    temporaries of it) is then mapped and unmapped again in every iteration,
    and its pages faulted in each time: 1.45x the step of an MLP with 1024-wide
    layers under AdamW, measured. glibc also stops raising its trim threshold
    once the mmap threshold is fixed, so the heap is cut back (and grown again)
    at smaller sizes too.
    """
    return DEFAULT_MMAP_THRESHOLD if world_size > 1 else 0


def _resolve_device(device: str | None, local_rank: int) -> str:
    if device is None:
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r} was requested but torch sees no CUDA device; "
            f"use device='cpu' or run on a machine with a GPU"
        )
    return str(device)


def make_env(
    cfg: Any,
    device: str | None = None,
    rank: int = 0,
    world_size: int = 1,
    local_rank: int = 0,
) -> Env:
    """Seed this process and describe it; reusable by distributed strategies.

    Call it after the process group is initialised (a ``seed=None`` config
    needs it to agree on one seed). ``cfg.env_cfg.cudnn_benchmark`` is honoured;
    on the CPU, ``env_cfg.malloc_mmap_threshold`` sets when glibc returns freed
    memory (:func:`return_freed_memory`); the rest of ``env_cfg`` (``mp_cfg``,
    ``dist_cfg``) belongs to the launcher and is ignored here.
    ``cfg.default_scope`` becomes MMEngine's default registry scope, so short
    names resolve as OpenMMLab configs expect.

    Parameters
    ----------
    cfg : mmengine.Config or mapping
        The run's config; ``randomness`` seeds the process
        (:func:`seed_everything`).
    device : str, optional
        Where to train; ``None`` picks ``cuda:<local_rank>`` when torch sees a
        CUDA device, else ``'cpu'``. A ``cuda`` device becomes the current one.
    rank, world_size, local_rank : int, optional
        This process's place in the run: rank 0 of 1 for a single process.

    Returns
    -------
    Env

    Raises
    ------
    ConfigError
        A ``cuda`` device was asked for and torch sees none.
    """
    resolved = _resolve_device(device, local_rank)
    if resolved.startswith("cuda:"):
        torch.cuda.set_device(torch.device(resolved))
    env_cfg = section(cfg, "env_cfg", {})
    if env_cfg.get("cudnn_benchmark") is not None:
        torch.backends.cudnn.benchmark = bool(env_cfg["cudnn_benchmark"])
    if resolved == "cpu":
        return_freed_memory(env_cfg.get("malloc_mmap_threshold",
                                        default_mmap_threshold(world_size)))
    scope = section(cfg, "default_scope")
    if scope:
        from mmengine.registry import DefaultScope

        if DefaultScope.get_current_instance() is None or (
            DefaultScope.get_current_instance().scope_name != scope
        ):
            DefaultScope.get_instance(f"flexgraph-{scope}-{id(cfg)}", scope_name=scope)
    randomness = section(cfg, "randomness", {})
    seed = seed_everything(randomness, rank)
    return Env(device=resolved, rank=rank, world_size=world_size, local_rank=local_rank,
               seed=seed, diff_rank_seed=bool(randomness.get("diff_rank_seed", False)))
