"""Checkpoints written by MMEngine's Runner (no RNG state, no position inside an epoch),
restated in flexgraph's terms for ``resume``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flexgraph.training.checkpoint._state import to_plain
from flexgraph.training.components import epoch_length_of
from flexgraph.training.errors import CheckpointError


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

    ``batch_idx`` comes from ``iter`` and the dataloader's length; without
    ``rng_states`` ``resume`` reseeds; the message hub is loaded, as MMEngine does.

    Parameters
    ----------
    checkpoint : Any
    by_epoch : bool
    train_dataloader : DataLoader or None
    message_hub : MessageHub, optional

    Returns
    -------
    Any
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
