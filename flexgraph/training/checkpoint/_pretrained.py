"""MMEngine's ``init_cfg=dict(type='Pretrained', ...)``: a load like ``load_from``.

MMEngine's ``PretrainedInit`` reads its checkpoint with MMEngine's own loader
(``torch.load`` that may unpickle anything, a traceback for a bad file). In a
flexgraph run the same initialiser loads through the IO that loads whole
models' ``load_from`` weights: the safe unpickling, formats told by content (a DCP
checkpoint works too), one-line errors naming the file, and MMEngine's
non-strict rules (missing, unexpected and reshaped keys are warnings). Every
strategy initialises on whole tensors (FSDP on the rank that builds the model
whole, ZeRO-3 with the parameters gathered), so a whole-model load is right
under all of them. Where the run found that its files cover the model and
pruned ``init_weights`` (:mod:`._coverage`), ``load_checkpoint`` loads the
same files, each into its module, through the run's own loader (into shards,
each rank reading its slices).

``prefix`` keeps MMEngine's meaning: the weights under ``prefix.`` (a
detector's ``backbone.``), renamed without it. URLs (``https://``,
``torchvision://``, ``open-mmlab://``) are left to MMEngine's loaders, which
download them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from flexgraph.training.checkpoint._file import FileCheckpointIO
from flexgraph.training.checkpoint._io import refuse_unloadable
from flexgraph.training.checkpoint._weights import weights_in
from flexgraph.training.errors import CheckpointError
from flexgraph.training.formats import DCP_DIRECTORY, format_of

__all__ = ["load_pretrained"]

_WHAT = "init_cfg Pretrained checkpoint"


def _under_prefix(path: Path, prefix: str) -> Any:
    """An ``on_read`` keeping only the weights under ``prefix.``, renamed without it."""
    start = prefix if prefix.endswith(".") else prefix + "."

    def keep(checkpoint: dict[str, Any]) -> None:
        weights = {k[len(start):]: v for k, v in weights_in(checkpoint, str(path)).items()
                   if k.startswith(start)}
        if not weights:
            raise CheckpointError(f"{_WHAT} {str(path)!r} has no weights under prefix "
                                  f"{start!r}; check init_cfg's prefix against the file")
        checkpoint.clear()
        checkpoint["state_dict"] = weights

    return keep


def load_pretrained(module: nn.Module, checkpoint: str, prefix: str | None, *,
                    loader: Any = None) -> None:
    """Load ``checkpoint`` (under ``prefix``) into ``module``, as MMEngine's Pretrained does.

    Parameters
    ----------
    module
        The module whose ``init_cfg`` names the checkpoint: whole tensors, or
        a sharded model's submodule when ``loader`` loads into shards.
    checkpoint
        A local path: a torch.save file, a safetensors file or a DCP checkpoint directory.
    prefix
        Load only the weights under ``prefix.``, renamed without it (``None``: all).
    loader
        What loads the weights: anything with ``load_weights(path, model, *, held,
        on_read)`` (a :class:`~flexgraph.training.checkpoint.WeightLoader`, or the run's
        :class:`~flexgraph.training.checkpoint.Checkpointer`, which picks its IO
        by the file's format). Default: one whole-model file loader, as
        ``init_weights`` runs on whole tensors.

    Raises
    ------
    CheckpointError
        The path is missing, unreadable, in no format a whole model loads, has
        nothing under ``prefix``, or matches no weight of ``module``.
    """
    from mmengine.logging import print_log

    path = Path(checkpoint)
    held = format_of(path)
    if loader is None:
        loader = FileCheckpointIO()
        held = refuse_unloadable(loader, path, held, what=_WHAT)
    if prefix is not None and held is DCP_DIRECTORY:
        raise CheckpointError(f"{_WHAT} {str(path)!r} is a torch.distributed.checkpoint "
                              f"directory, whose keys cannot be renamed on load: drop "
                              f"prefix={prefix!r}, or give a torch.save file")
    on_read = _under_prefix(path, prefix) if prefix is not None else (lambda checkpoint: None)
    loaded = loader.load_weights(path, module, held=held, on_read=on_read)
    if loaded:
        print_log(f"{_WHAT} {checkpoint}: {loaded.describe()}", logger="current",
                  level=logging.WARNING)
