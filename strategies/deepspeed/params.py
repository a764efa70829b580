"""ZeRO-3 parameters a forward cannot get: refused before training, or named when met.

DeepSpeed gathers a module's parameters right before its forward; when it cannot (the
parameter is empty, or read outside that forward) it stops with ``AssertionError:
{'id': 28, 'status': 'NOT_AVAILABLE', ...}``. The limit is DeepSpeed's; the message,
naming the parameter and the fixes, is ours. In-place writes to a parameter in a forward
are lost too, and are reported.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from flexgraph.core.errors import FlexgraphError

__all__ = ["ZeroParameterError", "empty_parameters", "named_parameter_errors",
           "watch_forward_writes"]

_OTHER_WAYS = "or use zero_optimization.stage 1 or 2, or FSDPStrategy, which handles this model"


class ZeroParameterError(FlexgraphError, RuntimeError):
    """Under ZeRO-3, a parameter a forward needs cannot be gathered."""


def _empty_message(names: list[str], maker: str | None) -> str:
    made = (f"{maker} deep-copies its layer, and under deepspeed.zero.Init the copies are "
            f"copies of empty placeholders" if maker else
            "they were copied (copy.deepcopy) from parameters deepspeed.zero.Init had "
            "already partitioned")
    which = (f"parameters {names[0]!r} and {len(names) - 1} more are" if len(names) > 1
             else f"parameter {names[0]!r} is")
    if maker is None:  # a copy the model makes of itself: a momentum encoder, a teacher
        return (f"ZeRO-3: {which} empty (0 elements): {made}; a model that copies or "
                f"writes its own weights trains only where they are whole: use "
                f"zero_optimization.stage 1 or 2, or DDPStrategy")
    return (f"ZeRO-3: {which} empty (0 elements): {made}; fix: build "
            f"each layer itself (nn.ModuleList([nn.TransformerEncoderLayer(...) for _ in "
            f"range(n)]) instead of nn.TransformerEncoder(layer, n)), {_OTHER_WAYS}")


def _copying_ancestor(model: nn.Module, name: str) -> str | None:
    """``'encoder (TransformerEncoder)'`` when a module that copies its layer holds ``name``."""
    parts = name.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:depth])
        module = model.get_submodule(prefix)
        if isinstance(module, (nn.TransformerEncoder, nn.TransformerDecoder)):
            return f"{prefix!r} ({type(module).__name__})"
    return None


def empty_parameters(model: nn.Module) -> str | None:
    """What is wrong with parameters ZeRO-3 holds no value of anywhere, or ``None``.

    ``torch.nn.TransformerEncoder`` deep-copies its layer, which under ``zero.Init`` is
    already partitioned: the copies hold empty placeholders.
    """
    empty = [name for name, p in model.named_parameters()  # a copy: no ds_id, no elements
             if getattr(p, "ds_numel", 1) == 0 or not hasattr(p, "ds_id") and p.numel() == 0]
    return _empty_message(empty, _copying_ancestor(model, empty[0])) if empty else None


def _summary(exc: AssertionError) -> dict[str, Any] | None:
    """DeepSpeed's ``param.ds_summary()``, when ``exc`` is its not-gathered assertion."""
    summary = exc.args[0] if exc.args else None
    if isinstance(summary, dict) and summary.get("status") == "NOT_AVAILABLE" \
            and "id" in summary:
        return summary
    return None


def _running_module(exc: BaseException, names: dict[int, str]) -> str | None:
    """The innermost module of the model whose call the traceback passes through."""
    running = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            running = f"{names[id(owner)] or 'model'!r} ({type(owner).__name__})"
        tb = tb.tb_next
    return running


@contextlib.contextmanager
def named_parameter_errors(model: nn.Module) -> Iterator[None]:
    """DeepSpeed's not-gathered assertion as a :class:`ZeroParameterError` naming the parameter."""
    try:
        yield
    except AssertionError as exc:
        summary = _summary(exc)
        if summary is None:
            raise
        params = {getattr(p, "ds_id", None): name for name, p in model.named_parameters()}
        name = params.get(summary["id"], f"<DeepSpeed parameter id {summary['id']}>")
        if summary.get("ds_numel") == 0:
            raise ZeroParameterError(
                _empty_message([name], _copying_ancestor(model, name) if name in
                               dict(model.named_parameters()) else None)) from exc
        module = _running_module(exc, {id(m): n for n, m in model.named_modules()})
        raise ZeroParameterError(
            f"ZeRO-3: parameter {name!r} was not gathered when {module or 'a module'} "
            f"needed it: DeepSpeed gathers a parameter for its own module's forward, and "
            f"code outside that forward reads it; fix: call "
            f"deepspeed.zero.register_external_parameter(<the module that reads it>, "
            f"<{name}>) in the model's __init__, {_OTHER_WAYS}") from exc


_AUGMENTED = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__"}


class _Writes(TorchFunctionMode):
    """Notes the in-place writes user code makes to ZeRO-3 parameters, or to their ``.data``."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names = names
        self.views: dict[int, tuple[Any, str]] = {}  # a parameter's .data, kept alive
        self.written: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if getattr(func, "__self__", None) is torch.Tensor.data and id(args[0]) in self.names:
            self.views[id(result)] = (result, self.names[id(args[0])])
        elif args and (name in _AUGMENTED or "out" in kwargs or (
                name.endswith("_") and not name.startswith("_") and name != "requires_grad_")):
            target = kwargs.get("out", args[0])
            written = self.names.get(id(target)) or self.views.get(id(target), (0, None))[1]
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if written and not caller.startswith(("deepspeed", "torch")):
                self.written.append(written)
        return result


def watch_forward_writes(model: nn.Module, report: Callable[[str], Any]) -> None:
    """``report`` the in-place writes to parameters in ``model``'s first training forward."""
    names = {id(p): n for n, p in model.named_parameters()}
    watch = _Writes(names)

    def before(module: nn.Module, args: Any) -> None:
        if module.training:
            watch.__enter__()

    def after(module: nn.Module, args: Any, output: Any) -> None:
        if not module.training:
            return
        watch.__exit__(None, None, None)
        for handle in handles:
            handle.remove()
        if watch.written:
            more = len(set(watch.written)) - 1
            report(f"ZeRO-3: the forward wrote in place to parameter {watch.written[0]!r}"
                   f"{f' and {more} more' if more else ''} (a momentum encoder updated in "
                   f"place?); ZeRO-3 keeps each rank's partition apart from the gathered "
                   f"copy and loses that write, so those weights never change; use DDPStrategy "
                   f"or DeepSpeed ZeRO-1/2, which keep the weights whole")

    handles = [model.register_forward_pre_hook(before),
               model.register_forward_hook(after, always_call=True)]
