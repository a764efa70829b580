"""``load_from`` into a sharded model (FSDP2's DTensors): no rank holds the whole model twice.

The loader of models every rank holds whole (:mod:`flexgraph.training.resume`)
copies a full state dict into each parameter; into shards that would be wrong
or impossible. Here:

* a directory is a sharded (DCP) checkpoint: each rank reads its own shards;
* a file is read by rank 0 only, and each rank receives its shard of every
  tensor (``set_model_state_dict(..., broadcast_from_rank0=True)``).

Afterwards, parameters that nothing initialised (see
:func:`~flexgraph.training.runtime.materialize_module`) are refused by name,
on every rank together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

from flexgraph.training.checkpoint import load_sharded_model_state, read_checkpoint_file, weights_in
from flexgraph.training.errors import CheckpointError, ConfigError
from flexgraph.training.resume import weights_to_load
from flexgraph.training.runtime import uninitialised_parameters

__all__ = ["load_full_file_into_shards", "load_weights_into_shards"]


def load_weights_into_shards(cfg: Any, env: Any, hooks: Any, model: torch.nn.Module
                             ) -> torch.nn.Module:
    """``cfg.load_from`` into ``model``'s shards; fires ``after_load_checkpoint``."""
    path = weights_to_load(cfg)
    if path is not None:
        runner = hooks.runner
        runner.model = model
        hooks.start_run()
        if Path(path).is_dir():
            missing = list(load_sharded_model_state(model, Path(path)))
            checkpoint: dict[str, Any] = {"meta": {}, "state_dict": {}}
        else:
            checkpoint, missing = load_full_file_into_shards(model, path)
        hooks.call("after_load_checkpoint", checkpoint=checkpoint)
        if missing:
            runner.logger.warning(f"load_from {path}: missing keys {missing}")
        runner.logger.info(f"Loaded weights from {path} into the shards")
    bad: list[list[str]] = [[] for _ in range(env.world_size)]
    torch.distributed.all_gather_object(bad, uninitialised_parameters(model))
    names = sorted({name for rank in bad for name in rank})
    if names:
        raise ConfigError(
            f"{len(names)} parameters were never initialised after materialize (e.g. "
            f"{names[0]!r}): their module has no reset_parameters(), the model's init_weights "
            f"did not set them" + (" (skip_init_weights=True)" if path is None else "")
            + ", and load_from did not hold them; give the module a reset_parameters() or "
            "load them from a checkpoint")
    return model


def load_full_file_into_shards(model: torch.nn.Module, path: str
                               ) -> tuple[dict[str, Any], list[str]]:
    """Rank 0 reads ``path``; every rank loads its shards from rank 0's tensors.

    Returns (what hooks see: rank 0's meta and weights, the others' meta), and
    the model keys the file lacks. An error on rank 0 reaches every rank.
    """
    keys = list(get_model_state_dict(model))  # names only; this rank's shards
    checkpoint, weights, answer = {}, {}, [None, []]
    if torch.distributed.get_rank() == 0:
        try:
            checkpoint = read_checkpoint_file(path)
            weights = {k.removeprefix("module."): v for k, v in weights_in(checkpoint,
                                                                           path).items()}
            matching = [k for k in keys if k in weights]
            if not matching:
                raise CheckpointError(
                    f"none of the {len(weights)} weights in {path!r} match a parameter of "
                    f"{type(model).__name__} (e.g. {next(iter(weights), '?')!r}); is it the "
                    f"right file?")
            weights = {k: weights[k] for k in matching}
            answer[1] = [k for k in keys if k not in weights]
        except Exception as exc:  # every rank must learn it, or the others wait forever
            answer[0] = exc
    torch.distributed.broadcast_object_list(answer, src=0)
    if answer[0] is not None:
        raise answer[0]
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    meta = checkpoint.get("meta", {}) if isinstance(checkpoint, dict) else {}
    return {"meta": meta, "state_dict": weights}, answer[1]
