"""Live tensor bytes during a traced step: a dispatch mode that counts storages.

Why not torch's ``MemTracker``: it snapshots every module on every operator,
14-16 s for one ViT-huge step here, where the step itself takes under one
second on the meta device. This counts only what a memory estimate needs: each
new storage's bytes when an operator creates it, minus them when Python lets
go of it (a weak reference's callback), and the highest total with the phase
and module it was reached in.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes"]


class LiveBytes(TorchDispatchMode):
    """Count the bytes of storages created under this mode that are still alive.

    ``phase`` (``"forward"``, ``"backward"``, ...) and ``module`` are set by the
    tracer; ``peak`` keeps the highest count and where it was reached.
    ``grads`` is kept by the tracer (the bytes of parameters' ``.grad`` so
    far); ``grads_at_peak`` is its value when the peak was reached.

    ``real=True`` counts a real run's memory rather than a traced step's:

    * storages on the meta device hold nothing there and are left out (DeepSpeed
      keeps a meta copy of every parameter's shape, 1 GiB of "storage" for a
      264 M-parameter model, counted as live until this was so);
    * code resizes real storages in place (FSDP2 frees a gathered parameter
      with ``storage.resize_(0)``, which no operator reports): before a count
      is taken as a new peak, every live storage's current size is read again.
      Meta storages never resize.

    A tensor subclass that wraps others (DTensor) is counted by the tensors it
    wraps: its own storage has the global size and holds nothing.
    """

    def __init__(self, real: bool = False) -> None:
        super().__init__()
        self.real = real
        self.live = 0
        self.peak = 0
        self.peak_phase = ""
        self.peak_module = ""
        self.phase = ""
        self.module = ""
        self.grads = 0
        self.grads_at_peak = 0
        self._refs: dict[int, Any] = {}
        self._sizes: dict[int, int] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No: torch would wrap ``__torch_dispatch__`` in ``torch._disable_dynamo``, which
        imports Dynamo (0.6 s) and costs a wrapper call per operator; nothing is
        compiled under this mode."""
        return False

    def ignore(self, tensors: Any) -> None:
        """Leave out the storages of ``tensors`` (parameters, buffers, the batch)."""
        for tensor in tensors:
            for plain in _plain_tensors(tensor):
                self._refs.setdefault(plain.untyped_storage()._cdata, None)

    def _forget(self, key: int) -> None:
        if self._refs.pop(key, None) is not None:
            self.live -= self._sizes.pop(key)

    def _recount(self) -> None:
        """Read every live storage's size again (see ``real``)."""
        for key, ref in list(self._refs.items()):
            storage = ref() if ref is not None else None
            if storage is not None:
                nbytes = storage.nbytes()
                self.live += nbytes - self._sizes[key]
                self._sizes[key] = nbytes

    def _count(self, tensor: torch.Tensor) -> None:
        if self.real and tensor.is_meta:
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._refs:
            return
        nbytes = storage.nbytes()
        self._refs[key] = weakref.ref(storage, lambda _, k=key: self._forget(k))
        self._sizes[key] = nbytes
        self.live += nbytes
        if self.live > self.peak and self.real:
            self._recount()
        if self.live > self.peak:
            self.peak, self.peak_phase, self.peak_module = self.live, self.phase, self.module
            self.grads_at_peak = self.grads

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                for plain in _plain_tensors(value):
                    self._count(plain)
        return out


def _plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that hold ``tensor``'s memory: itself, or a wrapper subclass's inner ones.

    A wrapper subclass (DTensor: FSDP2's parameters, their gradients and
    optimizer states) has a storage of the *global* size that holds no memory;
    its local shard holds it. This mode is off while an
    operator runs, so the shard's own allocation is never seen: it is counted
    here, through ``__tensor_flatten__``, and the wrapper's storage is not.
    """
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inner = [getattr(tensor, name) for name in names]
    return [plain for value in inner if isinstance(value, torch.Tensor)
            for plain in _plain_tensors(value)]
