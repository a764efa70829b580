"""MMEngine's ``init_cfg=dict(type='Pretrained', ...)``, loaded safely as ``load_from`` is.

Every strategy initialises on whole tensors, so a whole-model load is right under all.
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
    checkpoint
    prefix
        Only the weights under ``prefix.``, renamed without it; ``None``: all.
    loader
        A :class:`WeightLoader`; default: a whole-model file loader.
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
