"""State keyed by parameter name, never by position or wrapper prefix, as each strategy gives
and takes it."""

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
from flexgraph.training.runtime import world_size


def optimizers_of(optim_wrapper: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside an MMEngine wrapper (several for an OptimWrapperDict).

    Parameters
    ----------
    optim_wrapper : Any

    Returns
    -------
    list of torch.optim.Optimizer
    """
    wrappers = getattr(optim_wrapper, "optim_wrappers", None)
    if wrappers is not None:
        return [w.optimizer for w in wrappers.values()]
    return [optim_wrapper.optimizer]


def as_on_rank0(state: dict[str, Any], keys: Any) -> dict[str, Any]:
    """``state`` with the tensors at ``keys`` replaced by rank 0's values (a collective).

    For buffers, which nothing keeps equal across ranks: MMEngine's Runner saves
    rank 0's, while DCP writes each replicated tensor from whichever rank it likes.

    Parameters
    ----------
    state : dict
    keys : iterable of str

    Returns
    -------
    dict
    """
    if world_size() == 1:
        return state
    out = dict(state)
    for key in keys:
        value = out[key].detach().clone()
        torch.distributed.broadcast(value, src=0)
        out[key] = value
    return out


class StateAccess:
    """How a strategy's model and optimizer give and take name-keyed state (on every rank)."""

    name = "state"

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        """The model's weights and persistent buffers, keyed by parameter name."""
        raise NotImplementedError

    def optimizer_state(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        """``{'state': {name: {key: tensor}}, 'param_groups': [{..., 'params': [names]}]}``."""
        raise NotImplementedError

    def parameter_names(self, model: Any) -> list[str] | None:
        """Every parameter's name, frozen ones too; ``None`` where the optimizer holds them all."""
        return None

    def templates(self, model: Any, optim_wrapper: Any, saved: dict[str, tuple[int, ...]]
                  ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What a load reads into; ``saved`` (key -> global shape) lets an access build one."""
        model_part = self.model_state(model)
        optimizer_part = None if optim_wrapper is None else \
            self.optimizer_state(model, optim_wrapper)["state"]
        return model_part, optimizer_part

    def set_state(self, model: Any, optim_wrapper: Any, model_state: dict[str, Any],
                  optimizer_state: dict[str, Any] | None, *, full: bool,
                  strict: bool = True) -> None:
        """Put name-keyed state into the live objects; ``full``: whole tensors on every rank."""
        raise NotImplementedError


class TorchStateAccess(StateAccess):
    """torch's ``state_dict`` API: single device, DDP and FSDP2 alike."""

    name = "torch"

    def model_state(self, model: Any) -> dict[str, torch.Tensor]:
        state = get_model_state_dict(model)
        buffers = {b.data_ptr() for b in model.buffers()}  # the state's are views of them
        return as_on_rank0(state, [k for k, v in state.items() if isinstance(v, torch.Tensor)
                                   and not hasattr(v, "to_local") and v.data_ptr() in buffers])

    def optimizer_state(self, model: Any, optim_wrapper: Any) -> dict[str, Any]:
        return get_optimizer_state_dict(model, optimizers_of(optim_wrapper))

    def set_state(self, model: Any, optim_wrapper: Any, model_state: dict[str, Any],
                  optimizer_state: dict[str, Any] | None, *, full: bool,
                  strict: bool = True) -> None:
        options = StateDictOptions(full_state_dict=full, strict=strict)
        if not full:
            model_state = _sharded_like(get_model_state_dict(model), model_state)
        set_model_state_dict(model, model_state, options=options)
        if optim_wrapper is not None and optimizer_state is not None:
            set_optimizer_state_dict(model, optimizers_of(optim_wrapper), optimizer_state,
                                     options=StateDictOptions(full_state_dict=full))


def _sharded_like(templates: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each whole tensor cut to this rank's shard where the model's is a
    DTensor (a hook swapped it in, as EMAHook does)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    def cut(key: str, value: Any) -> Any:
        like = templates.get(key)
        if not isinstance(like, DTensor) or not torch.is_tensor(value) or isinstance(
                value, DTensor):
            return value
        return distribute_tensor(value.to(like.device), like.device_mesh, like.placements,
                                 src_data_rank=None)  # every rank holds it: no message

    return {key: cut(key, value) for key, value in state.items()}


def positions_to_names(saved: dict[str, Any], names: list[list[str]],
                       every: list[str] | None = None) -> dict[str, Any]:
    """A torch ``optimizer.state_dict()`` (parameters numbered) keyed by parameter name.

    ``names``: group by group, in torch's numbering order; ``every``: frozen ones
    too, for a saved optimizer that held them all where this run's (ZeRO) does not.
    """
    groups = saved.get("param_groups") or []
    sizes = [len(g.get("params", [])) for g in groups]
    if sizes == [len(g) for g in names]:
        kept = list(zip(groups, names, strict=True))
        name_of = {position: name for group, group_names in kept
                   for position, name in zip(group["params"], group_names, strict=True)}
    else:
        kept, name_of = _trained_groups(saved, names, every, sizes)
    trained = {n for g in names for n in g}
    return {
        "state": {name_of[int(k)]: v for k, v in (saved.get("state") or {}).items()
                  if name_of[int(k)] in trained},
        "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                          "params": list(group_names)} for g, group_names in kept],
    }


def _trained_groups(saved: dict[str, Any], names: list[list[str]], every: list[str] | None,
                    sizes: list[int]) -> tuple[list[tuple[dict[str, Any], list[str]]],
                                               dict[int, str]]:
    """The saved groups paired with this run's, when the saved ones also hold frozen ones."""
    mismatch = ValueError(f"its optimizer has groups of {sizes} parameters, this run's of "
                          f"{[len(g) for g in names]}")
    groups = saved.get("param_groups") or []
    if every is None or sum(sizes) != len(every):
        raise mismatch
    name_of = dict(zip((p for g in groups for p in g["params"]), every, strict=True))
    trained = {n for g in names for n in g}
    paired = [(g, [name_of[p] for p in g["params"] if name_of[p] in trained]) for g in groups]
    if [n for _, n in paired] != names:  # this run dropped the groups with nothing to train
        paired = [(g, n) for g, n in paired if n]
    if [n for _, n in paired] != names:
        raise mismatch
    stale = [name_of[int(k)] for k, v in (saved.get("state") or {}).items()
             if v and name_of[int(k)] not in trained]
    if stale:
        raise ValueError(f"it trained {stale[0]!r}, which this run's model freezes")
    return paired, name_of


def restore_into(access: StateAccess, checkpoint: dict[str, Any], what: str, *, model: Any,
                 optim_wrapper: Any, full: bool, strict: bool = True) -> None:
    """:meth:`StateAccess.set_state` of a read checkpoint; a mismatch names ``what``."""
    try:
        access.set_state(model, optim_wrapper, checkpoint["state_dict"],
                         checkpoint.get("optimizer"), full=full, strict=strict)
    except (KeyError, ValueError, RuntimeError) as exc:
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise CheckpointError(
            f"cannot restore {what} into this model: {type(exc).__name__}: {detail}; "
            f"resume with the model and optimizer config it was saved with") from exc

