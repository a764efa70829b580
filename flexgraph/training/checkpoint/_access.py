"""State keyed by parameter name: what each strategy gives to, and takes from, a checkpoint.

A portable checkpoint (:mod:`flexgraph.training.checkpoint._portable`) never
stores a tensor under a position or a wrapper's prefix: the model's weights are
keyed by the parameter's fully qualified name (``backbone.0.weight``), the
optimizer's state by the same name (``{'state': {name: {'exp_avg': ...}},
'param_groups': [{'lr': ..., 'params': [names]}]}``), torch's own
"state dict" layout for optimizers. A :class:`StateAccess` is how one
strategy's live objects produce and accept that layout; the strategy picks it
(``Configure('build_checkpointer', access=...)``), the checkpoint IOs stay the
same:

* :class:`TorchStateAccess` (single device, DDP, FSDP2): torch's
  ``get/set_model_state_dict`` and ``get/set_optimizer_state_dict``, which strip
  wrapper prefixes, name optimizer state by parameter and, for FSDP2, hand out
  and take this rank's DTensor shards (DCP reshards them on load).
* DeepSpeed's, in ``flexgraph.strategies.deepspeed.state``: its fp32 master
  weights and optimizer moments through ``deepspeed.utils``' ``safe_get_full_*``
  / ``safe_set_full_*`` (collectives under ZeRO-3).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from flexgraph.training.errors import CheckpointError

__all__ = ["StateAccess", "TorchStateAccess", "optimizers_of", "positions_to_names"]


def optimizers_of(optim_wrapper: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside an MMEngine wrapper (several for an OptimWrapperDict).

    Parameters
    ----------
    optim_wrapper : Any
        MMEngine's ``OptimWrapper`` or ``OptimWrapperDict``.

    Returns
    -------
    list of torch.optim.Optimizer
        Its optimizers, in order.
    """
    wrappers = getattr(optim_wrapper, "optim_wrappers", None)
    if wrappers is not None:
        return [w.optimizer for w in wrappers.values()]
    return [optim_wrapper.optimizer]


class StateAccess:
    """How a strategy's model and optimizer give and take name-keyed state.

    ``model_state`` / ``optimizer_state`` are what a save writes (tensors
    that DCP can save: full ones, or this rank's DTensor shards). They are
    also the templates a load fills in place (:meth:`templates`), after which
    :meth:`set_state` puts the values into the live objects. Every method is
    called on every rank and may be a collective.
    """

    name = "state"

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        """The model's weights and persistent buffers, keyed by parameter name."""
        raise NotImplementedError

    def optimizer_state(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        """``{'state': {name: {key: tensor}}, 'param_groups': [{..., 'params': [names]}]}``."""
        raise NotImplementedError

    def templates(self, model: Any, optim_wrapper: Any, saved: dict[str, tuple[int, ...]]
                  ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What a load reads into: the model's and the optimizer's state dicts.

        ``saved`` maps each tensor the checkpoint holds (``model.<name>``,
        ``optimizer.<name>.<key>``) to its global shape; an access that cannot
        produce a template of its own (an engine whose optimizer has no state
        yet) builds one from it.
        """
        model_part = self.model_state(model)
        optimizer_part = None if optim_wrapper is None else \
            self.optimizer_state(model, optim_wrapper)["state"]
        return model_part, optimizer_part

    def set_state(self, model: Any, optim_wrapper: Any, model_state: dict[str, Any],
                  optimizer_state: dict[str, Any] | None, *, full: bool,
                  strict: bool = True) -> None:
        """Put name-keyed state into the live model (and optimizer, when given).

        ``full``: every tensor is whole, on every rank (read from a single
        file), rather than the templates :meth:`templates` handed out.
        """
        raise NotImplementedError


class TorchStateAccess(StateAccess):
    """torch's ``state_dict`` API: single device, DDP and FSDP2 alike."""

    name = "torch"

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        return get_model_state_dict(model)

    def optimizer_state(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        return get_optimizer_state_dict(model, optimizers_of(optim_wrapper))

    def set_state(self, model: Any, optim_wrapper: Any, model_state: dict[str, Any],
                  optimizer_state: dict[str, Any] | None, *, full: bool,
                  strict: bool = True) -> None:
        options = StateDictOptions(full_state_dict=full, strict=strict)
        set_model_state_dict(model, model_state, options=options)
        if optim_wrapper is not None and optimizer_state is not None:
            set_optimizer_state_dict(model, optimizers_of(optim_wrapper), optimizer_state,
                                     options=StateDictOptions(full_state_dict=full))


def positions_to_names(saved: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    """A torch ``optimizer.state_dict()`` (parameters numbered) keyed by parameter name.

    The same model and optimizer config number their parameters the same way in
    every strategy, which is what lets a single-device or DDP ``.pth`` resume
    under FSDP or DeepSpeed.

    Parameters
    ----------
    saved : dict
        The saved optimizer state, its parameters numbered.
    names : list of list of str
        The current optimizer's parameter names group by group, in the order the
        optimizer holds them: the numbering torch's ``state_dict`` gives them (0,
        1, ... across the groups).

    Returns
    -------
    dict
        The same state, keyed (and its groups listed) by name.

    Raises
    ------
    ValueError
        The checkpoint's groups hold other counts than ``names`` (another model
        or optimizer config).
    """
    groups = saved.get("param_groups") or []
    if [len(g.get("params", [])) for g in groups] != [len(g) for g in names]:
        raise ValueError(
            f"its optimizer has groups of {[len(g.get('params', [])) for g in groups]} "
            f"parameters, this run's of {[len(g) for g in names]}")
    name_of = {position: name for group, group_names in zip(groups, names, strict=True)
               for position, name in zip(group["params"], group_names, strict=True)}
    return {
        "state": {name_of[int(k)]: v for k, v in (saved.get("state") or {}).items()},
        "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                          "params": list(group_names)}
                         for g, group_names in zip(groups, names, strict=True)],
    }


def restore_into(access: StateAccess, checkpoint: dict[str, Any], what: str, *, model: Any,
                 optim_wrapper: Any, full: bool, strict: bool = True) -> None:
    """:meth:`StateAccess.set_state` of a read checkpoint; a mismatch is one line naming ``what``.

    Raises
    ------
    CheckpointError
        The checkpoint's names or shapes do not fit this model or optimizer.
    """
    try:
        access.set_state(model, optim_wrapper, checkpoint["state_dict"],
                         checkpoint.get("optimizer"), full=full, strict=strict)
    except (KeyError, ValueError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise CheckpointError(
            f"cannot restore {what} into this model: {type(exc).__name__}: {detail}; "
            f"resume with the model and optimizer config it was saved with") from exc

