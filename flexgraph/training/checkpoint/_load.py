"""``load_from``: the weights a run starts from, one sequence for every strategy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flexgraph.training.checkpoint._checkpointer import Checkpointer
from flexgraph.training.checkpoint._coverage import WeightSource
from flexgraph.training.checkpoint._pretrained import load_pretrained
from flexgraph.training.components import unwrap_model
from flexgraph.training.formats import format_of


def load_weights(checkpointer: Checkpointer, path: str | None, model: Any, hooks: Any, *,
                 logger: Any, pretrained: Sequence[Mapping[str, Any]] = ()) -> Any:
    """Load ``pretrained`` files, then ``path`` (``load_from``), into ``model``.

    Parameters
    ----------
    checkpointer : Checkpointer
    path : str or None
    model : Any
    hooks : Hooks
        ``after_load_checkpoint`` sees what was read.
    logger : logging.Logger
    pretrained : sequence of Mapping, optional
        A pruned ``init_weights``'s files, loaded first without hooks.

    Returns
    -------
    Any
        ``model``.
    """
    for params in pretrained:
        source = WeightSource.from_params(params)
        target = unwrap_model(model)
        load_pretrained(target.get_submodule(source.module) if source.module else target,
                        source.path, source.prefix, loader=checkpointer)
    if path is None:
        return model
    hooks.hold(model=model)
    hooks.start_run()
    held = format_of(Path(path))
    loaded = checkpointer.load_weights(
        path, model, held=held, on_read=lambda checkpoint: hooks.call("after_load_checkpoint",
                                                                      checkpoint=checkpoint))
    if loaded:
        logger.warning(f"load_from {path}: {loaded.describe()}")
    logger.info(f"Loaded weights from {path}"
                + (f" (read as {held.name})" if held else ""))
    return model
