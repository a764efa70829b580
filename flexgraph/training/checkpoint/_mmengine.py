"""Checkpoints written by MMEngine's Runner, restated in flexgraph's terms for ``resume``.

A user migrating a half-trained MMEngine run hands flexgraph a file written by
``Runner.save_checkpoint``. Next to tensors and plain containers (read through
the allow-list of :func:`flexgraph.training.formats.mmengine_globals`) it holds:

* ``message_hub``: MMEngine's ``HistoryBuffer`` objects and runtime info;
* ``param_schedulers``: the schedulers' raw ``state_dict()`` (with
  ``collections.Counter`` milestones);
* ``meta``: ``epoch`` and ``iter`` as completed counts, and ``seed``; no RNG
  state and no position inside an epoch.

:func:`from_mmengine` restates such a checkpoint in flexgraph's terms for
``resume`` (the position inside the epoch, plain scheduler states) and puts
its message hub back, as MMEngine's ``Runner.resume`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.training.checkpoint._state import to_plain
from flexgraph.training.components import epoch_length_of
from flexgraph.training.errors import CheckpointError

__all__ = ["from_mmengine", "is_mmengine_checkpoint"]


def is_mmengine_checkpoint(checkpoint: Any) -> bool:
    """Whether ``checkpoint`` was written by MMEngine (its Runner or FlexibleRunner)."""
    if not isinstance(checkpoint, Mapping):
        return False
    meta = checkpoint.get("meta")
    return isinstance(meta, Mapping) and "flexgraph_version" not in meta and (
        "mmengine_version" in meta or "message_hub" in checkpoint)


def from_mmengine(checkpoint: Any, *, by_epoch: bool, train_dataloader: Any,
                  message_hub: Any = None) -> Any:
    """An MMEngine checkpoint in flexgraph's layout; any other checkpoint as it is.

    * ``meta.batch_idx``: MMEngine records completed epochs and iterations only;
      the batches of the current epoch already trained on are ``iter - epoch *
      len(train_dataloader)`` in an epoch loop (0 for a checkpoint saved at an
      epoch's end). In an iteration loop (``by_epoch=False``: the run's own loop),
      flexgraph counts passes over the data where MMEngine keeps ``epoch`` at 0,
      so both come from ``iter``.
    * ``param_schedulers``: made plain (:func:`~flexgraph.training.checkpoint.to_plain`)
      as flexgraph stores them. A dict of per-optimizer lists is refused.
    * ``rng_states``: left out, as MMEngine saves none; ``resume`` then reseeds.
    * ``message_hub``: loaded into ``message_hub`` (the run's), so hooks find
      MMEngine's scalars and runtime info as after MMEngine's own resume.

    Every other key (``state_dict``, ``optimizer``, extras such as
    ``ema_state_dict``) is kept as it is.

    Parameters
    ----------
    checkpoint : Any
        A checkpoint as read.
    by_epoch : bool
        Whether the run's loop is epoch-based.
    train_dataloader : DataLoader or None
        The run's; its length converts MMEngine's iteration count.
    message_hub : MessageHub, optional
        The run's message hub, which MMEngine's saved one is loaded into.

    Returns
    -------
    Any
        The checkpoint in flexgraph's layout (a new dict), or ``checkpoint`` itself
        when it is not MMEngine's.

    Raises
    ------
    CheckpointError
        The iteration count does not fit the train_dataloader's epoch length, or
        the schedulers are saved per optimizer.
    """
    if not is_mmengine_checkpoint(checkpoint):
        return checkpoint
    meta = dict(checkpoint["meta"])
    epoch, iteration = int(meta.get("epoch", 0)), int(meta.get("iter", 0))
    epoch_length = epoch_length_of(train_dataloader) if train_dataloader is not None else None
    if epoch_length:
        if by_epoch:
            batch_idx = iteration - epoch * epoch_length
            if not 0 <= batch_idx <= epoch_length:
                raise CheckpointError(
                    f"the MMEngine checkpoint stopped after {iteration} iterations in epoch "
                    f"{epoch + 1}, which does not fit {epoch_length} batches per epoch; "
                    f"resume with the dataset, batch size and number of processes it was "
                    f"trained with")
        else:
            epoch, batch_idx = divmod(iteration, epoch_length)
    else:
        batch_idx = 0
    meta.update(epoch=epoch, iter=iteration, batch_idx=batch_idx)
    schedulers = checkpoint.get("param_schedulers", [])
    if isinstance(schedulers, Mapping):
        raise CheckpointError(
            f"the MMEngine checkpoint holds parameter schedulers per optimizer "
            f"({sorted(schedulers)}); resuming those is not supported yet")
    hub = checkpoint.get("message_hub")
    if message_hub is not None and isinstance(hub, Mapping):
        message_hub.load_state_dict(hub)
    converted = {key: value for key, value in checkpoint.items() if key != "rng_states"}
    converted.update(meta=meta, param_schedulers=[to_plain(s) for s in schedulers])
    return converted
