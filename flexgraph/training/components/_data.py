"""Dataloaders from MMEngine-style config, with a resumable position.

The random streams are MMEngine's Runner's, draw for draw, so that a config
trains bit-identically under both (``tests/training/test_mmengine_parity.py``):

* the sampler gets the Runner's seed (``randomness.seed``), or, under
  ``diff_rank_seed``, none, so that it draws one from the global numpy RNG
  and shares rank 0's (``Runner.build_dataloader``);
* without a ``worker_init_fn`` in the config, every worker is seeded by
  MMEngine's ``default_worker_init_fn``: ``runner.seed + num_workers * rank +
  worker_id`` (:attr:`~flexgraph.training.runtime.Env.rank_seed`), the same in
  every epoch;
* loaders have no generator of their own, so starting a pass draws one number
  from the global torch RNG, where MMEngine's loop draws it (after
  ``before_train_epoch``); a loader with ``persistent_workers`` draws only at
  its first pass, as torch then reuses its iterator (:func:`epoch_batches`).

Resuming bit-identically in the middle of an epoch needs two more things from
the data side:

* the order of an epoch depends only on the sampler's seed and the epoch
  (MMEngine's ``DefaultSampler`` shuffles with ``seed + epoch``), not on how
  much global RNG was consumed before it; a resumed run whose checkpoint has
  another seed takes it over (:meth:`SkippableSampler.reseed`);
* skipping the batches an interrupted epoch had already trained on must not
  load them: :class:`SkippableSampler` drops their *indices* before the
  dataloader sees them.

What a pass draws from the global RNGs when it starts (and, for an iterable
dataset, what loading its skipped batches draws) happens inside
:func:`epoch_batches`, before the loop puts back the RNG state saved with the
checkpoint, so those draws never shift the resumed stream. Validation runs on
a fork of the RNG streams (:mod:`flexgraph.training.loop._train_loop`), so its draws do
not reach training either. Random transforms in the *workers* are the one
stream a resume does not continue: after a resume inside an epoch (and, with
``persistent_workers``, after any resume), each worker starts again from its
seed (docs/guide/parity.rst, "Deliberate differences").

Worker processes ignore the run's stop signals
(:mod:`flexgraph.training.loop._preemption`): a scheduler signals every process of a
job, and torch's launcher signals each rank's whole process group, so without
that a worker would die under its rank, which then fails on its next batch
instead of finishing the iteration and saving. The rank ends its workers itself:
torch stops them when their iterator goes away, and at exit, where
multiprocessing would end them with the SIGTERM they ignore and then wait for
them forever, they are killed instead (persistent workers live until then).

Collation: when the config names no ``collate_fn``, models built on MMEngine's
``BaseModel`` get ``pseudo_collate`` (what MMEngine's Runner uses and what their
data preprocessors expect), and plain ``nn.Module`` models get torch's
``default_collate`` (stacked tensors, ready for ``model(*batch)``).
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

__all__ = [
    "DATALOADER_KEYS",
    "SkippableSampler",
    "WorkerSeeding",
    "build_dataloader",
    "build_dataloaders",
    "epoch_batches",
    "epoch_length_of",
]

DATALOADER_KEYS = ("train_dataloader", "val_dataloader", "test_dataloader")

# MMEngine's Runner.train() builds these (the train loop's, then the validation
# loop's), so what building them draws from the global RNGs is part of its
# stream. It never builds the test dataloader.
_BUILT_BY_TRAIN = ("train_dataloader", "val_dataloader")


class SkippableSampler(torch.utils.data.Sampler):
    """A sampler (or batch sampler) whose next pass can start ``n`` items in.

    It forwards ``set_epoch`` and unknown attributes to the wrapped sampler, so
    code that inspects ``loader.sampler.shuffle`` or calls ``set_epoch`` keeps
    working. When nothing is skipped, ``__iter__`` returns the wrapped sampler's
    own iterator: the common path adds no per-index overhead.

    Parameters
    ----------
    sampler : Sampler
        The sampler (or batch sampler) the dataloader was built with.
    seed : int, default 0
        The run's base seed (:attr:`Env.seed`) the loader was built with.
    reseeders : sequence of callable, default ()
        Called with another base seed by :meth:`reseed` (the workers' seeding,
        the wrapped sampler's seed).
    """

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
        """Set the epoch of every sampler it wraps (their order is a function of seed and epoch).

        A batch sampler holds the sampler that shuffles as ``.sampler``, and
        many (torch's ``BatchSampler``, MMDetection's ``AspectRatioBatchSampler``)
        have no ``set_epoch`` to pass the epoch on: without reaching the inner
        sampler too, every epoch would repeat the first one's order. MMEngine's
        ``DistSamplerSeedHook`` reaches it there as well.
        """
        self.epoch = epoch
        for sampler in _wrapped_samplers(self.sampler):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)

    def reseed(self, seed: int) -> None:
        """Take over ``seed`` as the base seed (a resumed run's original one).

        The sampler's seed and the worker seeds become the ones a run seeded
        with ``seed`` had, so the order and the workers' draws follow it.
        """
        self.seed = seed
        for reseed in self._reseeders:
            reseed(seed)

    def skip_next(self, n: int) -> None:
        """Make the next ``iter()`` start ``n`` items in (indices, or batches)."""
        self._skip = int(n)


def _wrapped_samplers(sampler: Any) -> list[Any]:
    """``sampler``, the sampler it holds as ``.sampler``, that one's, and so on.

    How a batch sampler (or a wrapper of a sampler) holds the sampler that
    orders the indices; a chain that loops back on itself ends where it does.
    """
    chain: list[Any] = []
    while sampler is not None and not any(sampler is seen for seen in chain):
        chain.append(sampler)
        sampler = getattr(sampler, "sampler", None)
    return chain


def end_dataloader_workers() -> None:
    """Kill this process's daemonic children: what multiprocessing ends at exit.

    It ends them with SIGTERM and then waits for them; dataloader workers
    ignore SIGTERM, so it would wait forever. Registered after
    multiprocessing's own exit handler, so it runs first; a rank forked by
    multiprocessing (which runs no exit handlers) calls it itself.

    Loaders with workers install torch's SIGCHLD handler, which raises when a
    worker of a live iterator (persistent workers keep theirs) dies by a
    signal: the kills here would raise it wherever the process then is
    (multiprocessing's exit, joining its children), and fail a finished run.
    The process is ending, so SIGCHLD gets its default back first.
    """
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()


atexit.register(end_dataloader_workers)


class WorkerSeeding:
    """A dataloader worker's first act: ignore the stop signals, then seed itself.

    The seeding is MMEngine's Runner's: the config's own ``worker_init_fn`` if
    it names one, else MMEngine's ``default_worker_init_fn``, which seeds
    python, numpy and torch with ``seed + num_workers * rank + worker_id``
    (``seed`` is :attr:`Env.rank_seed`), so worker ``i`` of a rank starts every
    epoch from the same state. A module-level class, so that workers started
    by ``spawn`` can unpickle it.

    Parameters
    ----------
    env : Env
        This rank's environment: its rank, ``rank_seed`` and ``diff_rank_seed``.
    num_workers : int
        The dataloader's workers (MMEngine's seed formula counts them).
    init : callable, optional
        The config's own ``worker_init_fn``; MMEngine's default seeding when
        ``None``.
    stop_signals : sequence of str, default ()
        Signal names the workers ignore: the rank handles them.
    quiet : bool, default False
        MMEngine's ``disable_subprocess_warning``.
    """

    def __init__(self, env: Env, num_workers: int, *, init: Any = None,
                 stop_signals: Sequence[str] = (), quiet: bool = False) -> None:
        self.rank, self.diff_rank_seed = env.rank, env.diff_rank_seed
        self.seed = env.rank_seed
        self.num_workers = num_workers
        self.init = init
        self.stop_signals = tuple(stop_signals)
        self.quiet = quiet  # MMEngine's disable_subprocess_warning

    def reseed(self, seed: int) -> None:
        """Seed the workers as a run with base seed ``seed`` did."""
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
    """``iter(loader)``, drawing from the global torch RNG where MMEngine's loop does.

    A loader without a generator of its own draws its workers' base seed from
    the global torch RNG each time an iterator is made. With persistent
    workers, torch makes one at the first pass and only resets it afterwards,
    so an uninterrupted run draws at pass 0 and never again; a run resumed at a
    later pass makes its first iterator there, on a fork of the RNG, so that it
    draws nothing the uninterrupted run did not.
    """
    if epoch > 0 and loader.num_workers > 0 and loader.persistent_workers:
        with torch.random.fork_rng(devices=[]):
            return iter(loader)
    return iter(loader)


def per_rank_batch(loader: Any) -> int | None:
    """Samples per batch on this rank (``None``: the loader batches some other way).

    Parameters
    ----------
    loader : DataLoader or Any
        A dataloader; its ``batch_sampler`` (or ``batch_size``) is read.

    Returns
    -------
    int or None
        The batch size on this rank, or ``None``.
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    if isinstance(batch_sampler, torch.utils.data.BatchSampler):
        return int(batch_sampler.batch_size)
    size = getattr(loader, "batch_size", None)
    return int(size) if size else None


def set_per_rank_batch(loader: DataLoader, size: int) -> bool:
    """Make ``loader``'s batches ``size`` samples from its next pass on; ``False`` if it cannot.

    What a resume at another world size does to hold the global batch equal
    (DataLoader's own ``batch_size`` is read-only once built; its
    ``BatchSampler`` makes the batches).

    Parameters
    ----------
    loader : DataLoader
        A built dataloader.
    size : int
        Samples per batch on this rank from the next pass on.

    Returns
    -------
    bool
        ``False`` when the loader has no ``BatchSampler`` to change (nothing is
        changed then).
    """
    batch_sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(batch_sampler, torch.utils.data.BatchSampler):
        return False
    batch_sampler.batch_size = int(size)
    return True


def _skippable(loader: DataLoader) -> tuple[SkippableSampler | None, int]:
    """The loader's skippable sampler and how many of its items make one batch."""
    if isinstance(loader.batch_sampler, SkippableSampler):
        return loader.batch_sampler, 1
    if isinstance(loader.sampler, SkippableSampler):
        return loader.sampler, per_rank_batch(loader) or 1
    return None, 1


def epoch_batches(loader: DataLoader, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
    """Start pass ``epoch`` over ``loader``, optionally without its first batches.

    With a skippable sampler the skipped batches are never loaded: their
    indices are dropped before the dataloader (or its workers) sees them.
    Otherwise (an iterable dataset) they are read here and thrown away, so that
    whatever loading them draws from the global RNGs is drawn before the caller
    restores the RNG state that followed them.

    Parameters
    ----------
    loader : DataLoader
        The dataloader.
    epoch : int
        The pass to start (its sampler's ``set_epoch``).
    skip_batches : int, default 0
        Batches of this pass already trained (a resume mid-epoch).

    Returns
    -------
    iterator
        The pass's remaining batches.
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
    """The seed ``Runner.build_dataloader`` gives a sampler.

    The run's seed; under ``diff_rank_seed`` none, since the ranks' global
    RNGs were seeded apart: MMEngine's samplers then draw a seed from the
    global numpy RNG and take rank 0's (``sync_random_seed``), so that every
    rank still shuffles alike.
    """
    return None if env.diff_rank_seed else env.seed


def _reseed_sampler(sampler: Any, diff_rank_seed: bool, seed: int) -> None:
    """Give ``sampler`` the seed a run with base seed ``seed`` gave it.

    Under ``diff_rank_seed`` that is what ``sync_random_seed`` draws first
    from rank 0's numpy RNG once it is seeded with ``seed`` (``seed + 0``).
    """
    sampler.seed = int(np.random.RandomState(seed).randint(2**31)) if diff_rank_seed else seed


def _sampling(args: dict[str, Any], dataset: Any, env: Env, name: str, shuffle: bool,
              batch_size: int, workers: WorkerSeeding) -> dict[str, Any]:
    """Sampler (or batch sampler) arguments for a map-style dataset, made skippable."""
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
    """The workers' init from the config's ``worker_init_fn`` (a dict with ``type``)."""
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
    cfg
        ``dict(batch_size=..., num_workers=..., dataset=dict(type=...),
        sampler=dict(type='DefaultSampler', shuffle=True), collate_fn=...)``;
        torch-style ``shuffle=True`` without a sampler is accepted too. Other
        keys go to ``torch.utils.data.DataLoader``. A ready ``DataLoader`` is
        returned unchanged.
    env
        Supplies the seeds (for the sampler and the workers) and the rank.
    name
        The config key, for error messages.
    model_cfg
        ``cfg.model``, only to choose the default collate function.
    stop_signals
        Signals the workers ignore (the run's stop signals; see the module
        docstring).

    Returns
    -------
    DataLoader
        The dataloader, its sampler a :class:`SkippableSampler` (so a resume can
        start mid-epoch) where the config gives one.

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
    num_workers = int(args.pop("num_workers", 0))
    workers = _worker_seeding(args, env, name, num_workers, stop_signals)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        # The dataset orders itself; torch forbids samplers here, and resuming
        # inside an epoch can only skip batches by reading them.
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
    loader : DataLoader or Any
        A dataloader.

    Returns
    -------
    int or None
        Batches per pass, or ``None`` when the loader has no length.
    """
    try:
        return len(loader)
    except TypeError:
        return None


def build_dataloaders(cfg: Any, env: Env, *,
                      stop_signals: Sequence[str] = ()) -> dict[str, DataLoader | None]:
    """The train / val / test dataloaders the config defines (``None`` where absent).

    Built in MMEngine's order; the test dataloader, which MMEngine's training
    never builds, is built without drawing from the global RNGs (under
    ``diff_rank_seed`` its sampler would draw a seed from numpy's). Their
    workers ignore ``stop_signals`` (see :func:`build_dataloader`).

    Parameters
    ----------
    cfg : Config or Mapping
        The run's config.
    env : Env
        This rank's environment (seeds, rank).
    stop_signals : sequence of str, default ()
        Signals the workers ignore.

    Returns
    -------
    dict
        ``{'train_dataloader': ..., 'val_dataloader': ..., 'test_dataloader': ...}``.

    Raises
    ------
    ConfigError
        A dataloader section has no dataset, or a type the registries do not know.
    EmptyDatasetError
        A dataset is empty, or too small for one batch with ``drop_last``.
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
    """``build()``, with the global RNG streams put back as they were before it."""
    state = capture_rng()
    try:
        return build()
    finally:
        restore_rng(state)
