"""Dataloaders from MMEngine-style config, with a resumable position.

Resuming bit-identically in the middle of an epoch needs three things from the
data side, and this module owns all three:

* the order of an epoch must depend only on ``(seed, epoch)``, not on how much
  global RNG was consumed before it: samplers are built with the run's seed
  (MMEngine's ``DefaultSampler`` then shuffles with ``seed + epoch``);
* skipping the batches an interrupted epoch had already trained on must not
  load them: :class:`SkippableSampler` drops their *indices* before the
  dataloader sees them;
* creating a dataloader iterator must not draw from the global torch RNG (it
  does, to seed workers, unless the loader has its own generator): every loader
  gets a private generator, reseeded from ``(seed, epoch, rank)`` per epoch, so
  worker seeds are reproducible and training randomness does not depend on how
  often validation ran.

Worker processes ignore the run's stop signals
(:mod:`flexgraph.training.preemption`): a scheduler signals every process of a
job, and torch's launcher signals each rank's whole process group, so without
that a worker would die under its rank, which then fails on its next batch
instead of finishing the iteration and saving. The rank ends its workers itself.

Collation: when the config names no ``collate_fn``, models built on MMEngine's
``BaseModel`` get ``pseudo_collate`` (what MMEngine's Runner uses and what their
data preprocessors expect), and plain ``nn.Module`` models get torch's
``default_collate`` (stacked tensors, ready for ``model(*batch)``).
"""

from __future__ import annotations

import functools
import itertools
import signal
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from mmengine.registry import DATA_SAMPLERS, DATASETS, FUNCTIONS, MODELS
from torch.utils.data import DataLoader
from torch.utils.data import default_collate as torch_default_collate

from flexgraph.training.build import build_from_cfg, resolve_type
from flexgraph.training.config import stop_policy
from flexgraph.training.env import Env
from flexgraph.training.errors import ConfigError, EmptyDatasetError

__all__ = [
    "DATALOADER_KEYS",
    "SkippableSampler",
    "build_dataloader",
    "build_dataloaders",
    "epoch_batches",
    "epoch_length_of",
]

DATALOADER_KEYS = ("train_dataloader", "val_dataloader", "test_dataloader")


class SkippableSampler(torch.utils.data.Sampler):
    """A sampler (or batch sampler) whose next pass can start ``n`` items in.

    It forwards ``set_epoch`` and unknown attributes to the wrapped sampler, so
    code that inspects ``loader.sampler.shuffle`` or calls ``set_epoch`` keeps
    working. When nothing is skipped, ``__iter__`` returns the wrapped sampler's
    own iterator: the common path adds no per-index overhead.
    """

    def __init__(self, sampler: Any, generator: torch.Generator | None = None,
                 seed: int = 0, rank: int = 0) -> None:
        self.sampler = sampler
        self.generator = generator
        self.seed = seed
        self.rank = rank
        self.epoch = 0
        self._skip = 0

    def __iter__(self) -> Iterator[Any]:
        inner = iter(self.sampler)
        skip, self._skip = self._skip, 0
        return itertools.islice(inner, skip, None) if skip else inner

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        if name == "sampler":  # not yet set (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.sampler, name)

    def set_epoch(self, epoch: int) -> None:
        """Set the wrapped sampler's epoch and reseed the loader's private generator."""
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if self.generator is not None:
            # Tuples of ints hash identically in every process (no hash salt).
            self.generator.manual_seed(hash((self.seed, epoch, self.rank)) & (2**63 - 1))

    def reseed(self, seed: int) -> None:
        """Use ``seed`` for the order and worker seeds (a resumed run's original seed)."""
        self.seed = seed
        if hasattr(self.sampler, "seed"):
            self.sampler.seed = seed
        self.set_epoch(self.epoch)

    def skip_next(self, n: int) -> None:
        """Make the next ``iter()`` start ``n`` items in (indices, or batches)."""
        self._skip = int(n)


def _skippable(loader: DataLoader) -> tuple[SkippableSampler | None, int]:
    """The loader's skippable sampler and how many of its items make one batch."""
    if isinstance(loader.batch_sampler, SkippableSampler):
        return loader.batch_sampler, 1
    if isinstance(loader.sampler, SkippableSampler):
        return loader.sampler, loader.batch_size or 1
    return None, 1


def epoch_batches(loader: DataLoader, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
    """Start pass ``epoch`` over ``loader``, optionally without its first batches.

    The skipped batches are never loaded: their indices are dropped before the
    dataloader (or its workers) sees them.
    """
    sampler, per_batch = _skippable(loader)
    if sampler is not None:
        sampler.set_epoch(epoch)
        sampler.skip_next(skip_batches * per_batch)
    else:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        if skip_batches:
            batches = iter(loader)
            return itertools.islice(batches, skip_batches, None)
    return iter(loader)


def _collate_fn(cfg: Mapping[str, Any] | None, model_cfg: Any) -> Any:
    if cfg is None:
        return _pseudo_collate() if _is_base_model(model_cfg) else torch_default_collate
    if callable(cfg):
        return cfg
    if isinstance(cfg, str):
        cfg = {"type": cfg}
    args = dict(cfg)
    fn = resolve_type(args.pop("type"), FUNCTIONS, what="collate_fn")
    return functools.partial(fn, **args) if args else fn


def _pseudo_collate() -> Any:
    from mmengine.dataset import pseudo_collate as fn

    return fn


def _is_base_model(model_cfg: Any) -> bool:
    from mmengine.model import BaseModel

    if isinstance(model_cfg, torch.nn.Module):
        return isinstance(model_cfg, BaseModel)
    if not isinstance(model_cfg, Mapping) or "type" not in model_cfg:
        return False
    try:
        cls = resolve_type(model_cfg["type"], MODELS)
    except ConfigError:
        return False
    return isinstance(cls, type) and issubclass(cls, BaseModel)


def _sampling(args: dict[str, Any], dataset: Any, env: Env, name: str, shuffle: bool,
              batch_size: int, generator: torch.Generator) -> dict[str, Any]:
    """Sampler (or batch sampler) arguments for a map-style dataset, made skippable."""
    sampler_cfg = args.pop("sampler", None) or {"type": "DefaultSampler", "shuffle": shuffle}
    sampler = build_from_cfg(sampler_cfg, DATA_SAMPLERS, what=f"{name}.sampler",
                             default_args={"dataset": dataset, "seed": env.seed})
    batch_sampler_cfg = args.pop("batch_sampler", None)
    if batch_sampler_cfg is not None:
        batch_sampler = build_from_cfg(
            batch_sampler_cfg, DATA_SAMPLERS, what=f"{name}.batch_sampler",
            default_args={"sampler": sampler, "batch_size": batch_size})
        skippable = SkippableSampler(batch_sampler, generator, env.seed, env.rank)
        skippable.set_epoch(0)
        return {"batch_sampler": skippable}
    skippable = SkippableSampler(sampler, generator, env.seed, env.rank)
    skippable.set_epoch(0)
    return {"sampler": skippable, "batch_size": batch_size,
            "drop_last": bool(args.pop("drop_last", False))}


def _ignore_signals_then(names: Sequence[str], init: Any, worker_id: int) -> None:
    """A worker's first act: ignore the stop signals, then the config's own init."""
    for name in names:
        signal.signal(signal.Signals[name], signal.SIG_IGN)
    if init is not None:
        init(worker_id)


def build_dataloader(cfg: Any, env: Env, *, name: str = "dataloader",
                     model_cfg: Any = None, stop_signals: Sequence[str] = ()) -> DataLoader:
    """Build one dataloader from an MMEngine dataloader dict.

    Parameters
    ----------
    cfg:
        ``dict(batch_size=..., num_workers=..., dataset=dict(type=...),
        sampler=dict(type='DefaultSampler', shuffle=True), collate_fn=...)``;
        torch-style ``shuffle=True`` without a sampler is accepted too. Other
        keys go to ``torch.utils.data.DataLoader``. A ready ``DataLoader`` is
        returned unchanged.
    env:
        Supplies the seed (for the sampler and the worker seeds) and the rank.
    name:
        The config key, for error messages.
    model_cfg:
        ``cfg.model``, only to choose the default collate function.
    stop_signals:
        Signals the workers ignore (the run's stop signals; see the module
        docstring).

    Raises
    ------
    EmptyDatasetError
        The dataset is empty, or too small for one batch with ``drop_last``.
    """
    if isinstance(cfg, DataLoader):
        return cfg
    args = dict(cfg)
    dataset = args.pop("dataset", None)
    if dataset is None:
        raise ConfigError(f"{name}: no 'dataset'; add dataset=dict(type=...)")
    dataset = build_from_cfg(dataset, DATASETS, what=f"{name}.dataset")
    if hasattr(dataset, "full_init"):
        dataset.full_init()  # MMEngine datasets load their annotations lazily
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise EmptyDatasetError(
            f"{name}: dataset {type(dataset).__name__} has no samples; check its "
            f"data path / split so that it finds data"
        )
    shuffle = bool(args.pop("shuffle", False))
    batch_size = args.pop("batch_size", 1)
    generator = torch.Generator()
    if isinstance(dataset, torch.utils.data.IterableDataset):
        # The dataset orders itself; torch forbids samplers here, and resuming
        # inside an epoch can only skip batches by reading them.
        args.pop("sampler", None)
        generator.manual_seed(hash((env.seed, env.rank)) & (2**63 - 1))
        loader_args: dict[str, Any] = {"batch_size": batch_size,
                                       "drop_last": bool(args.pop("drop_last", False))}
    else:
        loader_args = _sampling(args, dataset, env, name, shuffle, batch_size, generator)
    collate = _collate_fn(args.pop("collate_fn", None), model_cfg)
    worker_init = args.pop("worker_init_fn", None)
    if isinstance(worker_init, Mapping):
        init_args = dict(worker_init)
        fn = resolve_type(init_args.pop("type"), FUNCTIONS, what=f"{name}.worker_init_fn")
        worker_init = functools.partial(fn, **init_args)
    num_workers = int(args.pop("num_workers", 0))
    if num_workers > 0 and stop_signals:
        worker_init = functools.partial(_ignore_signals_then, tuple(stop_signals), worker_init)
    if num_workers == 0:
        args.pop("persistent_workers", None)  # torch rejects it without workers
        args.pop("prefetch_factor", None)
    try:
        loader = DataLoader(dataset, num_workers=num_workers, collate_fn=collate,
                            worker_init_fn=worker_init, generator=generator,
                            **loader_args, **args)
    except TypeError as exc:
        raise ConfigError(f"{name}: {exc}") from exc
    if epoch_length_of(loader) == 0:
        raise EmptyDatasetError(
            f"{name}: {len(dataset)} samples make no batch of batch_size={batch_size} "
            f"with drop_last=True; lower batch_size or set drop_last=False"
        )
    return loader


def epoch_length_of(loader: Any) -> int | None:
    """``len(loader)``, or ``None`` for an iterable dataset without a length."""
    try:
        return len(loader)
    except TypeError:
        return None


def build_dataloaders(cfg: Any, env: Env) -> dict[str, DataLoader | None]:
    """The train / val / test dataloaders the config defines (``None`` where absent)."""
    model_cfg = cfg.get("model")
    signals = stop_policy(cfg).signals
    return {
        key: (build_dataloader(cfg[key], env, name=key, model_cfg=model_cfg,
                               stop_signals=signals)
              if cfg.get(key) is not None else None)
        for key in DATALOADER_KEYS
    }
