"""Dataloaders from MMEngine-style config, with a resumable position.

Their random streams are MMEngine's Runner's, draw for draw. Workers ignore the run's
stop signals, which reach every process: their rank saves and ends them.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import multiprocessing
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from mmengine.dataset import worker_init_fn as mmengine_worker_init_fn
from mmengine.registry import DATA_SAMPLERS, DATASETS, FUNCTIONS, MODELS
from torch.utils.data import DataLoader
from torch.utils.data import default_collate as torch_default_collate

from flexgraph.training.config import build_from_cfg, resolve_type
from flexgraph.training.errors import ConfigError, EmptyDatasetError
from flexgraph.training.runtime import Env, capture_rng, rank_seed, restore_rng

DATALOADER_KEYS = ("train_dataloader", "val_dataloader", "test_dataloader")

# what MMEngine's Runner.train() builds, so their draws are part of its stream
_BUILT_BY_TRAIN = ("train_dataloader", "val_dataloader")


class SkippableSampler(torch.utils.data.Sampler):
    """A sampler (or batch sampler) whose next pass can start ``n`` items in."""

    def __init__(self, sampler: Any, seed: int = 0,
                 reseeders: Sequence[Callable[[int], None]] = ()) -> None:
        self.sampler = sampler
        self.seed = seed
        self.epoch = 0
        self._reseeders = tuple(reseeders)
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
        """Set the epoch of every sampler in the chain: many batch samplers do not pass it on."""
        self.epoch = epoch
        for sampler in _wrapped_samplers(self.sampler):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)

    def reseed(self, seed: int) -> None:
        self.seed = seed
        for reseed in self._reseeders:
            reseed(seed)

    def skip_next(self, n: int) -> None:
        self._skip = int(n)


def _wrapped_samplers(sampler: Any) -> list[Any]:
    chain: list[Any] = []
    while sampler is not None and not any(sampler is seen for seen in chain):
        chain.append(sampler)
        sampler = getattr(sampler, "sampler", None)
    return chain


def end_dataloader_workers() -> None:
    """Kill this process's daemonic children, which ignore the SIGTERM multiprocessing ends
    them with at exit. SIGCHLD gets its default back first, or torch's handler would fail a
    finished run."""
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()


atexit.register(end_dataloader_workers)


class WorkerSeeding:
    """A dataloader worker's first act: ignore the stop signals, then seed itself (a class,
    so that ``spawn``-ed workers can unpickle it)."""

    def __init__(self, env: Env, num_workers: int, *, init: Any = None,
                 stop_signals: Sequence[str] = (), quiet: bool = False) -> None:
        self.rank, self.diff_rank_seed = env.rank, env.diff_rank_seed
        self.seed = env.rank_seed
        self.num_workers = num_workers
        self.init = init
        self.stop_signals = tuple(stop_signals)
        self.quiet = quiet  # MMEngine's disable_subprocess_warning

    def reseed(self, seed: int) -> None:
        self.seed = rank_seed(seed, self.rank, self.diff_rank_seed)

    def __call__(self, worker_id: int) -> None:
        for name in self.stop_signals:
            signal.signal(signal.Signals[name], signal.SIG_IGN)
        if self.init is not None:
            self.init(worker_id)
        else:
            mmengine_worker_init_fn(worker_id, self.num_workers, self.rank, self.seed,
                                    self.quiet)


def _start_pass(loader: DataLoader, epoch: int) -> Iterator[Any]:
    """``iter(loader)``, drawing from the global torch RNG where MMEngine's loop does."""
    if epoch > 0 and loader.num_workers > 0 and loader.persistent_workers:
        with torch.random.fork_rng(devices=[]):
            return iter(loader)
    return iter(loader)


def per_rank_batch(loader: Any) -> int | None:
    """Samples per batch on this rank (``None``: the loader batches some other way).

    Parameters
    ----------
    loader

    Returns
    -------
    int or None
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    if isinstance(batch_sampler, torch.utils.data.BatchSampler):
        return int(batch_sampler.batch_size)
    size = getattr(loader, "batch_size", None)
    return int(size) if size else None


def set_per_rank_batch(loader: DataLoader, size: int) -> bool:
    """Batch ``loader`` by ``size`` from its next pass on; ``False`` if it cannot.

    Parameters
    ----------
    loader, size

    Returns
    -------
    bool
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(batch_sampler, torch.utils.data.BatchSampler):
        return False
    batch_sampler.batch_size = int(size)
    return True


def _skippable(loader: DataLoader) -> tuple[SkippableSampler | None, int]:
    if isinstance(loader.batch_sampler, SkippableSampler):
        return loader.batch_sampler, 1
    if isinstance(loader.sampler, SkippableSampler):
        return loader.sampler, per_rank_batch(loader) or 1
    return None, 1


def epoch_batches(loader: DataLoader, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
    """Start pass ``epoch`` over ``loader``, without its first ``skip_batches`` (already trained).

    An iterable dataset's skipped batches are read here, before the checkpoint's RNG state
    is restored.

    Parameters
    ----------
    loader, epoch, skip_batches

    Returns
    -------
    iterator
    """
    sampler, per_batch = _skippable(loader)
    if sampler is not None:
        sampler.set_epoch(epoch)
        sampler.skip_next(skip_batches * per_batch)
        return _start_pass(loader, epoch)
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    batches = _start_pass(loader, epoch)
    for _ in itertools.islice(batches, skip_batches):
        pass
    return batches


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


def _sampler_seed(env: Env) -> int | None:
    """The seed ``Runner.build_dataloader`` gives a sampler (none under ``diff_rank_seed``)."""
    return None if env.diff_rank_seed else env.seed


def _reseed_sampler(sampler: Any, diff_rank_seed: bool, seed: int) -> None:
    sampler.seed = int(np.random.RandomState(seed).randint(2**31)) if diff_rank_seed else seed


def _sampling(args: dict[str, Any], dataset: Any, env: Env, name: str, shuffle: bool,
              batch_size: int, workers: WorkerSeeding) -> dict[str, Any]:
    sampler_cfg = args.pop("sampler", None) or {"type": "DefaultSampler", "shuffle": shuffle}
    sampler = build_from_cfg(sampler_cfg, DATA_SAMPLERS, what=f"{name}.sampler",
                             default_args={"dataset": dataset, "seed": _sampler_seed(env)})
    reseeders: list[Callable[[int], None]] = [workers.reseed]
    if isinstance(sampler_cfg, Mapping) and "seed" not in sampler_cfg and hasattr(sampler, "seed"):
        reseeders.append(functools.partial(_reseed_sampler, sampler, env.diff_rank_seed))
    batch_sampler_cfg = args.pop("batch_sampler", None)
    if batch_sampler_cfg is not None:
        batch_sampler = build_from_cfg(
            batch_sampler_cfg, DATA_SAMPLERS, what=f"{name}.batch_sampler",
            default_args={"sampler": sampler, "batch_size": batch_size})
        return {"batch_sampler": SkippableSampler(batch_sampler, env.seed, reseeders)}
    return {"sampler": SkippableSampler(sampler, env.seed, reseeders), "batch_size": batch_size,
            "drop_last": bool(args.pop("drop_last", False))}


def _worker_seeding(args: dict[str, Any], env: Env, name: str, num_workers: int,
                    stop_signals: Sequence[str]) -> WorkerSeeding:
    init = args.pop("worker_init_fn", None)
    if isinstance(init, Mapping):
        init_args = dict(init)
        fn = resolve_type(init_args.pop("type"), FUNCTIONS, what=f"{name}.worker_init_fn")
        init = functools.partial(fn, **init_args)
    quiet = bool(args.pop("disable_subprocess_warning", False))
    return WorkerSeeding(env, num_workers, init=init, stop_signals=stop_signals, quiet=quiet)


def build_dataloader(cfg: Any, env: Env, *, name: str = "dataloader",
                     model_cfg: Any = None, stop_signals: Sequence[str] = ()) -> DataLoader:
    """Build one dataloader from an MMEngine dataloader dict, seeded as MMEngine's Runner does.

    Parameters
    ----------
    cfg : Mapping or DataLoader
        Keys MMEngine does not take go to ``DataLoader``.
    env, stop_signals
    name : str
        The config key, for messages.
    model_cfg : Mapping, optional
        Chooses the default collate.

    Returns
    -------
    DataLoader
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
    num_workers = int(args.pop("num_workers", 0))
    workers = _worker_seeding(args, env, name, num_workers, stop_signals)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        # the dataset orders itself; torch forbids samplers here
        args.pop("sampler", None)
        loader_args: dict[str, Any] = {"batch_size": batch_size,
                                       "drop_last": bool(args.pop("drop_last", False))}
    else:
        loader_args = _sampling(args, dataset, env, name, shuffle, batch_size, workers)
    collate = _collate_fn(args.pop("collate_fn", None), model_cfg)
    if num_workers == 0:
        args.pop("persistent_workers", None)  # torch rejects it without workers
        args.pop("prefetch_factor", None)
    try:
        loader = DataLoader(dataset, num_workers=num_workers, collate_fn=collate,
                            worker_init_fn=workers if num_workers else None,
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
    """``len(loader)``, or ``None`` for an iterable dataset without a length.

    Parameters
    ----------
    loader

    Returns
    -------
    int or None
    """
    try:
        return len(loader)
    except TypeError:
        return None


def build_dataloaders(cfg: Any, env: Env, *,
                      stop_signals: Sequence[str] = ()) -> dict[str, DataLoader | None]:
    """The train / val / test dataloaders the config defines (``None`` where absent); the test
    one, which MMEngine's training never builds, draws nothing from the global RNGs.

    Parameters
    ----------
    cfg, env, stop_signals

    Returns
    -------
    dict
    """
    model_cfg = cfg.get("model")
    loaders: dict[str, DataLoader | None] = {}
    for key in DATALOADER_KEYS:
        if cfg.get(key) is None:
            loaders[key] = None
            continue
        build = functools.partial(build_dataloader, cfg[key], env, name=key,
                                  model_cfg=model_cfg, stop_signals=stop_signals)
        loaders[key] = build() if key in _BUILT_BY_TRAIN else _without_draws(build)
    return loaders


def _without_draws(build: Callable[[], DataLoader]) -> DataLoader:
    state = capture_rng()
    try:
        return build()
    finally:
        restore_rng(state)
