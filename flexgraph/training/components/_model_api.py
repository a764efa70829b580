"""The contract between the loop and a model: one training step, one eval step.

A step-API model (MMEngine's ``BaseModel``, possibly wrapped) brings its own
``train_step`` / ``val_step`` / ``test_step``. A plain ``nn.Module`` is called on
the batch (``*tuple``, ``**dict``) and returns a loss tensor or a dict whose keys
containing ``'loss'`` are summed; its step is what ``BaseModel.train_step`` does
around that forward. Either way the loop gets one callable, and a model that
yields no back-propagatable loss raises :class:`NoLossError` on the first batch,
before the optimizer has touched a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from flexgraph.training.errors import NoLossError


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / MMEngine wrappers / ``torch.compile``, however many.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    torch.nn.Module
    """
    from mmengine.model import is_model_wrapper

    while True:
        if is_model_wrapper(model) or isinstance(
            model, (nn.parallel.DistributedDataParallel, nn.DataParallel)
        ):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def uses_step_api(model: nn.Module) -> bool:
    """Whether the model, wrapped or not, has callable ``train_step`` and ``val_step``.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    bool
    """
    return callable(getattr(model, "train_step", None)) and callable(
        getattr(model, "val_step", None)
    )


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, Mapping):
        return type(obj)({k: _to_device(v, device) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_device(v, device) for v in obj)
    return obj


def batch_mover(device: str) -> Callable[[Any], Any] | None:
    """A function moving a batch's tensors to ``device``; ``None`` for the CPU.

    Dataloaders produce CPU tensors, so on the CPU the loop skips the call.
    """
    target = torch.device(device)
    if target.type == "cpu":
        return None
    return lambda batch: _to_device(batch, target)


def forward(model: nn.Module, batch: Any) -> Any:
    """Call a plain model on a batch: ``**dict``, ``*tuple/list``, or the batch itself.

    Parameters
    ----------
    model : torch.nn.Module
        A plain module (no ``train_step``).
    batch : Any

    Returns
    -------
    Any
        What ``model(...)`` returns.
    """
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(batch)


def _name(model: nn.Module) -> str:
    return type(unwrap_model(model)).__name__


def loss_of(output: Any, model: nn.Module, *, training: bool = True) -> tuple[Any, Any]:
    """Split a plain model's output into ``(loss to minimise, values to log)``.

    The values to log are MMEngine's ``outputs``: the loss under ``'loss'``,
    and every other tensor key of a dict output.

    Parameters
    ----------
    output : Any
    model : torch.nn.Module
        Named in errors.
    training : bool, default True
        Whether the loss must require grad.

    Returns
    -------
    tuple
        ``(loss, logged)``.

    Raises
    ------
    NoLossError
        A non-scalar tensor, one without grad while training, a dict with no
        ``'loss'`` key, or any other output.
    """
    if isinstance(output, torch.Tensor):
        if training and not output.requires_grad:
            raise NoLossError(
                f"model {_name(model)} returned a tensor that does not require grad, so "
                f"there is nothing to back-propagate; return the loss computed from "
                f"the model's outputs (not a detached value or a metric)"
            )
        if output.numel() != 1:
            raise NoLossError(
                f"model {_name(model)} returned a tensor of shape {tuple(output.shape)} "
                f"from forward(), not a scalar loss; reduce it to the loss to minimise "
                f"(e.g. F.cross_entropy(logits, y)) or return a dict of losses"
            )
        loss = output if output.ndim == 0 else output.reshape(())
        return loss, {"loss": loss}
    if isinstance(output, Mapping):
        logged = {k: v.mean() for k, v in output.items() if isinstance(v, torch.Tensor)}
        parts = [v for k, v in logged.items() if "loss" in k]
        if not parts or (training and not any(p.requires_grad for p in parts)):
            raise NoLossError(
                f"model {_name(model)} returned a dict with keys {sorted(output)} and no "
                f"key containing 'loss' that requires grad; name the losses to "
                f"minimise e.g. 'loss' or 'loss_cls' (all such keys are summed)"
            )
        total = parts[0] if len(parts) == 1 else sum(parts)
        return total, {"loss": total, **{k: v for k, v in logged.items() if k != "loss"}}
    raise NoLossError(
        f"model {_name(model)} returned {type(output).__name__} from forward(); return "
        f"a loss tensor or a dict of losses (keys containing 'loss'), or subclass "
        f"mmengine.model.BaseModel to define train_step yourself"
    )


@contextmanager
def _checked_parse_losses(module: nn.Module):
    """Temporarily make ``module.parse_losses`` refuse a loss-less dict."""
    original = module.parse_losses

    def parse_losses(losses: Any) -> Any:
        loss, log_vars = original(losses)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            keys = sorted(losses) if isinstance(losses, Mapping) else type(losses).__name__
            raise NoLossError(
                f"model {type(module).__name__}.forward(mode='loss') returned {keys}: no "
                f"key containing 'loss' holds a tensor that requires grad; return e.g. "
                f"dict(loss_cls=...)"
            )
        return loss, log_vars

    module.parse_losses = parse_losses
    try:
        yield
    finally:
        del module.parse_losses  # back to the class's method


def make_train_step(model: nn.Module, optim_wrapper: Any, device: str) -> Callable[[Any], Any]:
    """One optimisation step on a batch; returns what the loop logs for it.

    A step-API model runs its own ``train_step``; a plain model's step is what
    ``BaseModel.train_step`` does around the forward: ``optim_context``, then the
    wrapper's ``update_params`` (accumulation, AMP, clipping, step).

    Parameters
    ----------
    model : torch.nn.Module
    optim_wrapper : OptimWrapper
    device : str
        Where a plain model's batches move.

    Returns
    -------
    callable
        ``batch -> logged``.
    """
    if uses_step_api(model):
        module = unwrap_model(model)
        train_step = model.train_step
        checked = [not hasattr(module, "parse_losses")]

        def step_api(batch: Any) -> Any:
            if checked[0]:
                return train_step(batch, optim_wrapper=optim_wrapper)
            checked[0] = True
            with _checked_parse_losses(module):
                return train_step(batch, optim_wrapper=optim_wrapper)

        return step_api

    move = batch_mover(device)

    def plain(batch: Any) -> Any:
        if move is not None:
            batch = move(batch)
        with optim_wrapper.optim_context(model):
            output = forward(model, batch)
        loss, logged = loss_of(output, model)
        optim_wrapper.update_params(loss)
        return logged

    return plain


def make_eval_step(model: nn.Module, device: str, *, mode: str,
                   with_evaluator: bool) -> Callable[[Any], Any]:
    """One evaluation step (``mode`` is ``'val'`` or ``'test'``), run under no_grad.

    With an evaluator it returns predictions for ``Evaluator.process`` (a plain
    model's output made a list); without one, the batch's mean loss.

    Parameters
    ----------
    model : torch.nn.Module
    device : str
        Where a plain model's batches move.
    mode : {'val', 'test'}
    with_evaluator : bool

    Returns
    -------
    callable
        ``batch -> predictions`` (or mean loss).
    """
    if uses_step_api(model):
        if with_evaluator:
            return getattr(model, f"{mode}_step")
        module = unwrap_model(model)

        def step_api_loss(batch: Any) -> Any:
            data = module.data_preprocessor(batch, False)
            losses = (module(**data, mode="loss") if isinstance(data, Mapping)
                      else module(*data, mode="loss"))
            loss, _ = module.parse_losses(losses)
            return loss

        return step_api_loss

    move = batch_mover(device)

    def plain(batch: Any) -> Any:
        if move is not None:
            batch = move(batch)
        output = forward(model, batch)
        if with_evaluator:
            return output if isinstance(output, (list, tuple)) else [output]
        return loss_of(output, model, training=False)[0]

    return plain
