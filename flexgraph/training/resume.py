"""Resuming a run: everything a checkpoint holds, so that training continues where it stopped.

This rank's RNG state goes to the loop in :class:`LoopState`, which restores it at the
matching point. ``after_load_checkpoint`` fires before applying, as in MMEngine, so a
hook may still rewrite the checkpoint. A group restarted by torch's elastic agent
resumes from the latest complete checkpoint, whatever ``resume`` says; ``'auto'`` skips
incomplete or unreadable ones, but never one this strategy cannot restore: resuming
from anything older would silently lose its progress.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from io import StringIO
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from flexgraph.render.plan_change import plan_change_view
from flexgraph.training.checkpoint import (
    Checkpointer,
    LoopState,
    from_mmengine,
    restore_schedulers,
)
from flexgraph.training.components import epoch_length_of, per_rank_batch, set_per_rank_batch
from flexgraph.training.config import RunSettings
from flexgraph.training.errors import CheckpointError, ForeignCheckpointError
from flexgraph.training.formats import CheckpointFormat, format_of
from flexgraph.training.loop import Hooks
from flexgraph.training.runtime import (
    agreed,
    capture_rng,
    seed_everything,
    this_rank,
    world_size,
)

__all__ = ["resume_training"]

Read = Callable[[Path, CheckpointFormat | None], dict[str, Any]]


def _read_resumable(checkpointer: Checkpointer, path: Path, held: CheckpointFormat | None,
                    model: Any, optim_wrapper: Any, convert: Callable[[Any], Any]
                    ) -> dict[str, Any]:
    """Read ``path`` and check that it holds a training state; the ranks agree on failure."""
    def read() -> dict[str, Any]:
        checkpoint = convert(checkpointer.read(path, held=held, model=model,
                                               optim_wrapper=optim_wrapper))
        meta = checkpoint.get("meta") if isinstance(checkpoint, dict) else None
        if not isinstance(meta, dict) or "iter" not in meta:
            raise CheckpointError(
                f"{str(path)!r} has no training state to resume (no meta/iter); use "
                f"load_from for a weights-only file, or resume from a flexgraph checkpoint")
        return checkpoint

    return agreed(read, kind=CheckpointError)


def _newest_resumable(checkpointer: Checkpointer, read: Read, logger: Any, what: str
                      ) -> tuple[Path, CheckpointFormat | None, dict[str, Any]] | None:
    """The newest checkpoint in the work_dir that reads whole, with its format and contents
    (``None``: there is none); the others are skipped with a warning naming each."""
    skipped: list[str] = []
    for path in checkpointer.checkpoint_paths():
        held = format_of(path)
        if held is not None and checkpointer.restorer_for(held) is None:
            raise ForeignCheckpointError(
                f"{what}: the newest checkpoint {str(path)!r} is {held.name}, which this "
                f"strategy cannot restore; resume it with the strategy that wrote it (set "
                f"its checkpoint_format='portable' to write checkpoints every strategy "
                f"resumes), or move it out of the work_dir to resume from an older one")
        problem = checkpointer.problem(path, held)
        if problem is None:
            try:
                return path, held, read(path, held)
            except ForeignCheckpointError:
                raise  # another strategy's: skipping it would lose its progress
            except CheckpointError as exc:
                problem = str(exc)
        logger.warning(f"{what}: skipping {path.name}: {problem}")
        skipped.append(problem)
    if skipped:
        raise CheckpointError(
            f"{what}: none of the {len(skipped)} checkpoints in "
            f"{str(checkpointer.work_dir)!r} can be resumed (the newest: {skipped[0]}); "
            f"remove them to start from scratch")
    return None


def _hold_global_batch(meta: dict[str, Any], train_dataloader: Any, logger: Any,
                       path: Any) -> None:
    """Keep the checkpoint's global batch at another world size: change the per-rank batch
    (DefaultSampler deals an epoch out to the ranks in turn: a mid-epoch resume then goes
    on with exactly the samples not yet seen)."""
    saved = meta.get("global_batch")
    per_rank, ranks = per_rank_batch(train_dataloader), world_size()
    if not saved or not per_rank or per_rank * ranks == saved:
        return
    if saved % ranks:
        raise CheckpointError(
            f"{str(path)!r} was trained with a global batch of {saved} samples, which "
            f"{ranks} processes cannot share evenly; resume with a number of processes "
            f"that divides {saved}")
    if not set_per_rank_batch(train_dataloader, saved // ranks):
        logger.warning(f"resume: the checkpoint's global batch is {saved}, this run's "
                       f"{per_rank * ranks}; its train_dataloader cannot be rebatched")
        return
    logger.info(f"resume: global batch {saved} held over {ranks} processes: "
                f"train_dataloader batch {per_rank} -> {saved // ranks} per process")


def _log_plan_change(checkpoint: dict[str, Any], meta: dict[str, Any], logger: Any,
                     current: Mapping[str, Any] | None) -> None:
    """Log what changed since the plan that saved ``checkpoint`` (only the portable format's
    manifest holds one; else the world size it was saved at)."""
    manifest = checkpoint.get("manifest") or {}
    saved_world, ranks = manifest.get("world_size", meta.get("world_size")), world_size()
    saved_plan = manifest.get("plan")
    if saved_plan and current:
        view = plan_change_view(saved_plan, current, saved_world=saved_world,
                                current_world=ranks)
        if view is not None:
            text = StringIO()
            Console(file=text, width=110, color_system=None, soft_wrap=False).print(view)
            logger.info("resume: what changed since the checkpoint was saved\n"
                        + text.getvalue().rstrip())
        return
    if saved_world is not None and saved_world != ranks:
        logger.info(f"resume: the checkpoint was saved by {saved_world} processes, this run "
                    f"has {ranks}")


def resume_training(*, settings: RunSettings, model: torch.nn.Module, optim_wrapper: Any,
                    param_schedulers: Any, checkpointer: Checkpointer, hooks: Hooks,
                    train_dataloader: Any, plan: Mapping[str, Any] | None, logger: Any,
                    message_hub: Any) -> LoopState:
    """Restore the run from the checkpoint ``resume`` asks for.

    A fresh :class:`LoopState` when not resuming, or when ``resume='auto'`` finds no
    checkpoint (the first run of a restartable job).
    """
    source = settings.resume
    restart = settings.restart
    if source is None and not restart:
        return LoopState()
    what = f"restart {restart}" if restart else "resume='auto'"
    # only epoch loops promise a fixed epoch length (an iteration loop's sampler may be infinite)
    epoch_length = epoch_length_of(train_dataloader) if train_dataloader is not None else None
    by_epoch = settings.train is not None and settings.train.by_epoch

    def read(path: Path, held: CheckpointFormat | None) -> dict[str, Any]:
        return _read_resumable(checkpointer, path, held, model, optim_wrapper, lambda checkpoint:
                               from_mmengine(checkpoint, by_epoch=by_epoch,
                                             train_dataloader=train_dataloader,
                                             message_hub=message_hub))

    def read_given(path: str) -> tuple[Any, CheckpointFormat | None, dict[str, Any]]:
        held = format_of(Path(path))
        return path, held, read(Path(path), held)

    if source == "auto" or restart:
        found = _newest_resumable(checkpointer, read, logger, what)
        if found is None and restart and source not in (None, "auto"):
            found = read_given(source)  # nothing saved since the first attempt
        if found is None:
            logger.info(f"{what}: no checkpoint in {checkpointer.work_dir}; "
                               f"starting from scratch")
            return LoopState()
        path, held, checkpoint = found
    else:
        path, held, checkpoint = read_given(source)
    meta = checkpoint["meta"]
    if this_rank() == 0:
        _log_plan_change(checkpoint, meta, logger, plan)
    hooks.hold(model=model, optim_wrapper=optim_wrapper, param_schedulers=param_schedulers)
    hooks.start_run()
    hooks.call("after_load_checkpoint", checkpoint=checkpoint)
    checkpointer.apply(checkpoint, path, held=held, model=model, optim_wrapper=optim_wrapper,
                       strict=True)
    restore_schedulers(param_schedulers, checkpoint.get("param_schedulers", []))
    checkpointer.restore_saved(checkpoint)

    if train_dataloader is not None:
        _hold_global_batch(meta, train_dataloader, logger, path)
        epoch_length = epoch_length_of(train_dataloader)
    epoch, iteration, batch_idx = meta["epoch"], meta["iter"], meta.get("batch_idx", 0)
    data_pass = meta.get("data_pass", epoch)
    message_hub.update_info_dict(dict(meta.get("runtime_info") or {}))
    if by_epoch and epoch_length is not None and batch_idx > epoch_length:
        raise CheckpointError(
            f"{str(path)!r} stopped after batch {batch_idx} of an epoch, but the "
            f"train_dataloader now has {epoch_length} batches per epoch; "
            f"resume with the batch size and dataset it was saved with")
    seed = meta.get("seed")
    sampler = getattr(train_dataloader, "sampler", None)
    if seed is not None and hasattr(sampler, "reseed") and sampler.seed != seed:
        logger.warning(f"resume: using the checkpoint's seed {seed} for the data "
                              f"order (this run was seeded with {sampler.seed})")
        sampler.reseed(seed)
    rank, ranks = this_rank(), world_size()
    states = checkpoint.get("rng_states") or []
    if len(states) == ranks:
        rng_state = states[rank]
    else:
        held = (f"RNG states of {len(states)} ranks but this run has {ranks}" if states
                else "no RNG state (MMEngine's checkpoints have none)")
        logger.warning(f"resume: the checkpoint holds {held}; reseeding instead, "
                              f"so random draws will differ")
        seed_everything({"seed": (seed or 0) + iteration, "diff_rank_seed": True}, rank)
        rng_state = capture_rng()
    restarted = f" (restart {restart} of the group)" if restart else ""
    logger.info(f"Resumed from {path}: epoch {epoch}, iter {iteration}{restarted}")
    return LoopState(epoch=epoch, iter=iteration, batch_idx=batch_idx, data_pass=data_pass,
                     rng_state=rng_state, resumed_from=str(path))
