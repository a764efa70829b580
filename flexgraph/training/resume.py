"""Bringing a checkpoint into the run: ``load_from`` weights and full ``resume``.

``load_from`` only seeds the model's weights (fine-tuning, evaluation), loading
non-strictly like MMEngine, from a single file every rank reads: the loader of
models every rank holds whole. Sharding strategies replace the
``load_checkpoint`` step with their own loader. ``resume`` restores everything a
checkpoint holds so that training continues exactly where it stopped: weights
(strictly), optimizer, schedulers, the loop position, and this rank's RNG state
(handed to the loop in :class:`LoopState`, because the loop must restore it at
the matching point). It reads and applies through the run's checkpointer, so it
works unchanged for every checkpoint IO.

Both fire ``after_load_checkpoint(runner, checkpoint)`` before applying the
checkpoint, as MMEngine does, so a hook may still rewrite its contents.
"""

from __future__ import annotations

from typing import Any

import torch

from flexgraph.training.checkpoint import (
    Checkpointer,
    apply_weights,
    load_checkpoint_file,
    restore_schedulers,
)
from flexgraph.training.config import resume_source, section, train_schedule
from flexgraph.training.data import epoch_length_of
from flexgraph.training.env import seed_everything
from flexgraph.training.errors import CheckpointError
from flexgraph.training.hooks import Hooks
from flexgraph.training.state import LoopState, capture_rng

__all__ = ["load_weights", "resume_training", "weights_to_load"]


def _rank_and_world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def weights_to_load(cfg: Any) -> str | None:
    """``cfg.load_from``, unless ``resume`` will load that very file (then ``None``)."""
    path = section(cfg, "load_from")
    if not path or resume_source(cfg) == str(path):
        return None
    return str(path)


def load_weights(cfg: Any, hooks: Hooks, model: torch.nn.Module) -> torch.nn.Module:
    """Load ``cfg.load_from`` into ``model`` (unless ``resume`` will load that file)."""
    path = weights_to_load(cfg)
    if path is None:
        return model
    checkpoint = load_checkpoint_file(path)
    runner = hooks.runner
    runner.model = model
    hooks.start_run()
    hooks.call("after_load_checkpoint", checkpoint=checkpoint)
    apply_weights(model, checkpoint, str(path), strict=False, logger=runner.logger)
    runner.logger.info(f"Loaded weights from {path}")
    return model


def resume_training(*, cfg: Any, model: torch.nn.Module, optim_wrapper: Any,
                    param_schedulers: Any, checkpointer: Checkpointer, hooks: Hooks,
                    train_dataloader: Any) -> LoopState:
    """Restore the run from the checkpoint ``cfg.resume`` asks for.

    Returns a fresh :class:`LoopState` when not resuming, or when
    ``resume='auto'`` finds no checkpoint (logged, not an error: the first run
    of a restartable job has nothing to resume).

    Raises
    ------
    CheckpointError
        The checkpoint lacks training state (e.g. a weights-only file) or does
        not fit this config (other schedulers, a position past the epoch).
    """
    source = resume_source(cfg)
    runner = hooks.runner
    if source is None:
        return LoopState()
    path = checkpointer.latest() if source == "auto" else source
    if path is None:
        runner.logger.info(f"resume='auto': no checkpoint in {checkpointer.work_dir}; "
                           f"starting from scratch")
        return LoopState()
    checkpoint = checkpointer.read(path, model=model, optim_wrapper=optim_wrapper)
    meta = checkpoint.get("meta") if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or "iter" not in meta:
        raise CheckpointError(
            f"{str(path)!r} has no training state to resume (no meta/iter); use "
            f"load_from for a weights-only file, or resume from a flexgraph checkpoint")
    runner.model, runner.optim_wrapper = model, optim_wrapper
    runner.param_schedulers = param_schedulers
    hooks.start_run()
    hooks.call("after_load_checkpoint", checkpoint=checkpoint)
    checkpointer.apply(checkpoint, path, model=model, optim_wrapper=optim_wrapper, strict=True)
    restore_schedulers(param_schedulers, checkpoint.get("param_schedulers", []))
    checkpointer.restore_saved(checkpoint)

    epoch, iteration, batch_idx = meta["epoch"], meta["iter"], meta.get("batch_idx", 0)
    data_pass = meta.get("data_pass", epoch)
    # What hooks recorded for a resumed run (MMEngine's runtime-info names: best scores).
    runner.message_hub.update_info_dict(dict(meta.get("runtime_info") or {}))
    # Only epoch loops promise a fixed epoch length (iteration loops may run an
    # infinite sampler, whose single "epoch" outgrows len(train_dataloader)).
    epoch_length = epoch_length_of(train_dataloader) if train_dataloader is not None else None
    by_epoch = epoch_length is not None and train_schedule(cfg, epoch_length).by_epoch
    if by_epoch and batch_idx > epoch_length:
        raise CheckpointError(
            f"{str(path)!r} stopped after batch {batch_idx} of an epoch, but the "
            f"train_dataloader now has {epoch_length} batches per epoch; "
            f"resume with the batch size and dataset it was saved with")
    seed = meta.get("seed")
    sampler = getattr(train_dataloader, "sampler", None)
    if seed is not None and hasattr(sampler, "reseed") and sampler.seed != seed:
        runner.logger.warning(f"resume: using the checkpoint's seed {seed} for the data "
                              f"order (this run was seeded with {sampler.seed})")
        sampler.reseed(seed)
    rank, world_size = _rank_and_world()
    states = checkpoint.get("rng_states") or []
    if len(states) == world_size:
        rng_state = states[rank]
    else:
        runner.logger.warning(
            f"resume: the checkpoint holds RNG states of {len(states)} ranks but this "
            f"run has {world_size}; reseeding instead, so random draws will differ")
        seed_everything({"seed": (seed or 0) + iteration, "diff_rank_seed": True}, rank)
        rng_state = capture_rng()
    runner.logger.info(f"Resumed from {path}: epoch {epoch}, iter {iteration}")
    return LoopState(epoch=epoch, iter=iteration, batch_idx=batch_idx, data_pass=data_pass,
                     rng_state=rng_state, resumed_from=str(path))
