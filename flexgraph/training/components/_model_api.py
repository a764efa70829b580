"""The contract between the loop and a model: one training step, one eval step.

Two kinds of model are accepted, and the loop never branches on which it got:
:func:`make_train_step` and :func:`make_eval_step` return a plain callable for
either kind.

* **Step-API models** (MMEngine's ``BaseModel``, possibly inside
  ``MMDistributedDataParallel``): the model owns the step,
  ``model.train_step(batch, optim_wrapper)`` returns its log variables and
  ``val_step`` / ``test_step`` return predictions for an evaluator.
* **Plain ``nn.Module`` models** (possibly inside torch DDP or ``torch.compile``):
  ``forward(*batch)`` for a tuple/list batch, ``forward(**batch)`` for a dict
  batch, returning a loss tensor or a dict whose keys containing ``'loss'`` are
  summed (every tensor key is logged). The optimizer wrapper's
  ``optim_context`` surrounds the forward so gradient accumulation (no_sync) and
  AMP (autocast) work as in MMEngine.

A model that yields no back-propagatable loss raises :class:`NoLossError` on the
first batch, before the optimizer has touched a parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from flexgraph.training.errors import NoLossError

__all__ = [
    "batch_mover",
    "forward",
    "loss_of",
    "make_eval_step",
    "make_train_step",
    "unwrap_model",
    "uses_step_api",
]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / MMEngine wrappers / ``torch.compile``.

    Parameters
    ----------
    model : torch.nn.Module
        A model, possibly wrapped (several times).

    Returns
    -------
    torch.nn.Module
        The innermost module.
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
    """Whether the model brings its own ``train_step`` / ``val_step`` (MMEngine style).

    Parameters
    ----------
    model : torch.nn.Module
        A model, wrapped or not.

    Returns
    -------
    bool
        ``True`` when it has callable ``train_step`` and ``val_step``.
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

    Dataloaders produce CPU tensors, so on the CPU there is nothing to do and the
    loop skips the call altogether.

    Parameters
    ----------
    device : str
        The device the model trains on.

    Returns
    -------
    callable or None
        ``batch -> batch`` with every tensor on ``device``, or ``None`` on the
        CPU.
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
        A plain module (not one with MMEngine's ``train_step``).
    batch : Any
        One batch from the dataloader, on the model's device.

    Returns
    -------
    Any
        What ``model(...)`` returns.
    """
    if isinstance(batch, (tuple, list)):  # checked first: a cheap, exact type test
        return model(*batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(batch)


def _name(model: nn.Module) -> str:
    return type(unwrap_model(model)).__name__


def loss_of(output: Any, model: nn.Module, *, training: bool = True) -> tuple[Any, Any]:
    """Split a plain model's output into ``(loss to minimise, values to log)``.

    The logged value is the detached loss for a tensor output, or a dict with the
    total under ``'loss'`` and every tensor key of a dict output.

    Parameters
    ----------
    output : Any
        What the model's forward returned.
    model : torch.nn.Module
        The model, named in errors.
    training : bool, default True
        Whether the loss must require grad (evaluation passes ``False``).

    Returns
    -------
    tuple
        ``(loss, logged)``: the scalar loss to back-propagate, and what the loop
        logs (the detached loss, or a dict of the detached values).

    Raises
    ------
    NoLossError
        A tensor that is not a scalar or does not require grad (while training),
        a dict with no key containing ``'loss'``, or any other kind of output.
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
        loss = output.reshape(())
        return loss, loss.detach()
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
        if len(logged) == 1 and "loss" in logged:
            return total, total.detach()
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

    The returned callable is what the hot loop calls every iteration, so it binds
    everything it needs up front and does no per-call dispatch on the model kind.
    A plain model's loss comes back with its (already back-propagated) graph, as
    MMEngine's ``train_step`` returns its log variables: the loop holds the last
    one until the next step is done, as a hand-written loop does with its
    ``loss`` variable, and that keeps autograd's per-parameter gradient
    accumulators alive for the next backward instead of rebuilding them (2% of
    a 0.3 ms step, measured). The loop's output detaches what it keeps.

    Parameters
    ----------
    model : torch.nn.Module
        The (wrapped) model.
    optim_wrapper : OptimWrapper
        MMEngine's wrapper: backward, accumulation, clipping and the step.
    device : str
        The device batches move to (a plain model's).

    Returns
    -------
    callable
        ``batch -> logged``: MMEngine's log variables, or a plain model's loss (or
        dict of losses).
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
    context = optim_wrapper.optim_context
    update = _update_fn(optim_wrapper)

    def plain(batch: Any) -> Any:
        if move is not None:
            batch = move(batch)
        with context(model):
            output = forward(model, batch)
        loss, logged = loss_of(output, model)
        update(loss)
        return logged

    def plain_without_context(batch: Any) -> Any:
        if move is not None:
            batch = move(batch)
        # forward(), inlined for the collated tuple or list: one Python frame
        # less on the hot path (see _update_fn)
        output = model(*batch) if isinstance(batch, (tuple, list)) else forward(model, batch)
        if type(output) is torch.Tensor and output.requires_grad and output.ndim == 0:
            update(output)  # the common case, without the generality of loss_of()
            return output  # with its graph: see make_train_step
        loss, logged = loss_of(output, model)
        update(loss)
        return logged

    return plain if _needs_context(optim_wrapper) else plain_without_context


def _plain_optim_wrapper(optim_wrapper: Any, *methods: str) -> bool:
    """Whether ``optim_wrapper`` uses MMEngine's own ``methods`` with no accumulation."""
    from mmengine.optim import OptimWrapper

    cls = type(optim_wrapper)
    return getattr(optim_wrapper, "_accumulative_counts", None) == 1 and all(
        getattr(cls, m, None) is getattr(OptimWrapper, m) for m in methods)


def _needs_context(optim_wrapper: Any) -> bool:
    """``optim_context`` matters for accumulation (no_sync) and AMP (autocast) only.

    MMEngine's base ``OptimWrapper`` without accumulation yields an empty
    context; skipping it saves a generator-based context manager per step.
    """
    return not _plain_optim_wrapper(optim_wrapper, "optim_context")


def _update_fn(optim_wrapper: Any) -> Callable[[torch.Tensor], None]:
    """``optim_wrapper.update_params``, minus the work it does for nothing.

    Without accumulation MMEngine's ``update_params`` divides the loss by 1 (an
    extra autograd node, forward and backward) and always steps. The shortcut
    calls the same ``backward`` / ``step`` / ``zero_grad`` (so AMP's overrides,
    clipping and the inner count still apply) and gives bit-identical results;
    any wrapper that overrides ``update_params`` or ``scale_loss`` keeps its own.

    Where those three are MMEngine's own and nothing is clipped, their bodies
    are written out here (``loss.backward()``, the inner count,
    ``optimizer.step()``, ``optimizer.zero_grad()``): on a step of half a
    millisecond the three method frames, and the keyword dicts they pass on,
    are a share of what the loop costs over a hand-written one (see
    docs/benchmarks/loop_overhead.rst). The optimizer is read on every call,
    as MMEngine's methods read it.
    """
    if not _plain_optim_wrapper(optim_wrapper, "update_params", "scale_loss"):
        return optim_wrapper.update_params
    if (_plain_optim_wrapper(optim_wrapper, "backward", "step", "zero_grad")
            and not optim_wrapper.clip_grad_kwargs):

        def update_unclipped(loss: torch.Tensor) -> None:
            loss.backward()
            optim_wrapper._inner_count += 1
            optimizer = optim_wrapper.optimizer
            optimizer.step()
            optimizer.zero_grad()

        return update_unclipped
    backward, step, zero_grad = (optim_wrapper.backward, optim_wrapper.step,
                                 optim_wrapper.zero_grad)

    def update(loss: torch.Tensor) -> None:
        backward(loss)
        step()
        zero_grad()

    return update


def make_eval_step(model: nn.Module, device: str, *, mode: str,
                   with_evaluator: bool) -> Callable[[Any], Any]:
    """One evaluation step (``mode`` is ``'val'`` or ``'test'``), run under no_grad.

    With an evaluator it returns predictions for ``Evaluator.process``: the
    model's ``val_step``/``test_step`` result, or a plain model's forward output
    (wrapped in a one-element list unless it already is a list or tuple). Without
    an evaluator it returns the batch's mean loss as a tensor.

    Parameters
    ----------
    model : torch.nn.Module
        The (wrapped) model.
    device : str
        The device batches move to (a plain model's).
    mode : {'val', 'test'}
        Which of MMEngine's step methods to call.
    with_evaluator : bool
        Whether the config has an evaluator to process predictions.

    Returns
    -------
    callable
        ``batch -> predictions`` (or the batch's mean loss without an evaluator).
    """
    if uses_step_api(model):
        if with_evaluator:
            return getattr(model, f"{mode}_step")
        module = unwrap_model(model)

        def step_api_loss(batch: Any) -> Any:
            data = module.data_preprocessor(batch, False)
            loss, _ = module.parse_losses(module._run_forward(data, mode="loss"))
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
