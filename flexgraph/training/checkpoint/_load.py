"""``load_from``: the weights a run starts from, through the run's checkpointer.

One load sequence for every strategy (:func:`load_weights`, the
``load_checkpoint`` step's): the ``init_cfg`` ``Pretrained`` files first, then
``load_from``, non-strictly like MMEngine. What the path holds is asked once
(:func:`~flexgraph.training.formats.format_of`) and handed down to the IO that
reads it; the checkpointer's IO, which the strategy configures, knows how
weights go into the model it manages (whole, sharded, inside an engine).

The hooks are the run's (``loop`` is above this layer, so they come in as an
argument): they are shown the model, the run starts for them, and
``after_load_checkpoint`` sees what was read before it goes in, as in MMEngine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flexgraph.training.checkpoint._checkpointer import Checkpointer
from flexgraph.training.checkpoint._coverage import WeightSource
from flexgraph.training.checkpoint._pretrained import load_pretrained
from flexgraph.training.components import unwrap_model
from flexgraph.training.formats import format_of

__all__ = ["load_weights"]


def load_weights(checkpointer: Checkpointer, path: str | None, model: Any, hooks: Any, *,
                 logger: Any, pretrained: Sequence[Mapping[str, Any]] = ()) -> Any:
    """Load ``pretrained`` files, then ``path`` (``load_from``), into ``model``.

    Keys left out are a warning, as in MMEngine.

    Parameters
    ----------
    checkpointer : Checkpointer
        The run's; its IO reads the files into the model it manages.
    path : str or None
        The ``load_from`` file (``None``: none, or ``resume`` loads it).
    model : Any
        The model as the run holds it at this step.
    hooks : Hooks
        The run's hooks (:class:`~flexgraph.training.loop.Hooks`): shown the
        model, the run started for them, ``after_load_checkpoint`` fired with
        what was read.
    logger : logging.Logger
        The run's log (what was loaded, and the keys left out).
    pretrained : sequence of Mapping, optional
        The ``init_cfg`` ``Pretrained`` files of a run whose ``init_weights``
        was pruned because its files cover the model
        (:class:`~flexgraph.training.checkpoint.WeightSource` params), loaded
        first, each into its module, through the same IO, without hooks (as
        MMEngine's ``Pretrained`` calls none).

    Returns
    -------
    Any
        ``model``, its weights loaded.

    Raises
    ------
    CheckpointError
        A path is in no format the run's IO loads, is damaged, or matches no
        weight of the model.
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
