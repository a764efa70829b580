"""One training step traced on the meta device: how many activation bytes it keeps, in
fp32, under autocast's rules, or with the model in half (DeepSpeed's fp16 / bf16)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
from torch import nn
from torch.utils._pytree import tree_map

from flexgraph.training.components import forward, loss_of, unwrap_model, uses_step_api
from flexgraph.training.errors import TrainingError

from ._attention import FusedAttention
from ._autocast import MetaAutocast
from ._live_bytes import LiveBytes

COMPUTE_MODES = ("fp32", "amp:fp16", "amp:bf16", "half:fp16", "half:bf16")
"""How a step computes: fp32; AMP (autocast over fp32 weights); the model in half."""

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class UntraceableModelError(TrainingError):
    """A model's training step cannot run on the meta device: an operator's output shape
    depends on values, or it has no meta kernel."""


@attrs.frozen
class StepTrace:
    """What one traced step kept alive, in bytes (parameters and the batch left out)."""

    peak: int
    grads_at_peak: int
    grads: int
    phase: str
    module: str

    @property
    def activations(self) -> int:
        return self.peak - self.grads_at_peak


@contextlib.contextmanager
def _module_names(model: nn.Module, counter: LiveBytes,
                  modes: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """Keep ``counter.module`` on the innermost module running forward, and ``modes()`` on.

    Autograd runs backward without torch-function modes, so a forward that activation
    checkpointing recomputes there enters ``modes()`` again.
    """
    names = {id(m): name or type(m).__name__ for name, m in model.named_modules()}
    stack: list[str] = []
    reentered: list[tuple[int, contextlib.ExitStack]] = []

    def enter(module: nn.Module, args: Any) -> None:
        stack.append(names.get(id(module), type(module).__name__))
        counter.module = stack[-1]
        if torch._C._len_torch_function_stack() == 0:
            active = contextlib.ExitStack()
            active.enter_context(modes())
            reentered.append((len(stack), active))

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        if reentered and reentered[-1][0] == len(stack):
            reentered.pop()[1].close()
        if stack:
            stack.pop()
        counter.module = stack[-1] if stack else ""

    pre = nn.modules.module.register_module_forward_pre_hook(enter)
    post = nn.modules.module.register_module_forward_hook(leave)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def _to_meta(batch: Any, dtype: torch.dtype | None = None) -> Any:
    def move(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if dtype is not None and value.is_floating_point():
            return value.to("meta", dtype)
        return value.to("meta")

    return _map_batch(move, batch)


def _map_batch(fn: Callable[[Any], Any], batch: Any) -> Any:
    """Apply ``fn`` to the tensors of a batch (MMEngine's data samples are moved whole)."""
    if hasattr(batch, "to") and not isinstance(batch, torch.Tensor) and hasattr(batch, "keys"):
        return batch.to("meta")
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(_map_batch(fn, v) for v in batch)
    if isinstance(batch, dict):
        return {k: _map_batch(fn, v) for k, v in batch.items()}
    return tree_map(fn, batch)


def _loss(model: nn.Module, batch: Any, half: torch.dtype | None) -> torch.Tensor:
    """The step's loss: MMEngine's ``train_step`` without the optimizer, or a plain forward.

    ``half``: the dtype the inputs are cast to, as DeepSpeed's ``inputs_to_half`` does.
    """
    if uses_step_api(model):
        module = unwrap_model(model)
        data = module.data_preprocessor(batch, True)
        if half is not None:
            data = _map_batch(lambda v: v.to(half) if v.is_floating_point() else v, data)
        losses = module._run_forward(data, mode="loss")
        loss, _ = module.parse_losses(losses)
        return loss
    loss, _ = loss_of(forward(model, batch), model)
    return loss


def _preprocessor_on_meta(model: nn.Module) -> None:
    preprocessor = getattr(unwrap_model(model), "data_preprocessor", None)
    if preprocessor is not None and hasattr(preprocessor, "_device"):
        preprocessor._device = torch.device("meta")


def trace_step(model: nn.Module, batch: Any, compute: str = "fp32",
               memo: dict[Any, Any] | None = None) -> StepTrace:
    """Run forward and backward of ``model`` (built on meta) on ``batch``; count live bytes.

    ``compute`` is one of :data:`COMPUTE_MODES`; ``memo`` holds the meta kernels' results,
    shared by the traces of one estimate. The model is left with no ``.grad``, in fp32.
    """
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {COMPUTE_MODES}, not {compute!r}")
    kind, _, low = compute.partition(":")
    dtype = _DTYPES.get(low)
    _preprocessor_on_meta(model)
    if kind == "half":
        model.to(dtype)
    counter = LiveBytes(memo=memo)

    def grad_done(param: torch.Tensor) -> None:
        counter.grads += param.grad.nbytes

    params = [p for p in model.parameters() if p.requires_grad]
    hooks = [p.register_post_accumulate_grad_hook(grad_done) for p in params]
    def modes() -> contextlib.ExitStack:
        active = contextlib.ExitStack()
        active.enter_context(FusedAttention())
        if kind == "amp":
            active.enter_context(MetaAutocast(dtype))
        return active

    try:
        with _module_names(model, counter, modes), counter:
            counter.ignore([*model.parameters(), *model.buffers()])
            counter.phase = "forward"
            meta_batch = _to_meta(batch, dtype if kind == "half" else None)
            try:
                with modes():
                    loss = _loss(model, meta_batch, dtype if kind == "half" else None)
                counter.phase, counter.module = "backward", ""
                loss.backward()
            except (NotImplementedError, RuntimeError, TypeError) as exc:
                raise _untraceable(model, counter, exc) from exc
            del loss, meta_batch
        return StepTrace(peak=counter.peak, grads_at_peak=counter.grads_at_peak,
                         grads=counter.grads, phase=counter.peak_phase,
                         module=counter.peak_module)
    finally:
        for hook in hooks:
            hook.remove()
        for param in model.parameters():
            param.grad = None
        if kind == "half":
            model.float()


def _untraceable(model: nn.Module, counter: LiveBytes, exc: BaseException) -> UntraceableModelError:
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = counter.module or type(unwrap_model(model)).__name__
    return UntraceableModelError(
        f"{counter.phase or 'forward'} of module {where!r} cannot run on the meta device: "
        f"{first_line[:200]}; activations are not estimated (parameters and optimizer "
        f"states still are); give the operator a meta kernel (torch.library.register_fake) "
        f"or estimate with a model whose shapes do not depend on tensor values")

