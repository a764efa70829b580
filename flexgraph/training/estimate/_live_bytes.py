"""Live tensor bytes during a traced step: a dispatch mode that counts each new storage
until Python lets go of it (torch's ``MemTracker`` snapshots every module per operator)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_unflatten


class LiveBytes(TorchDispatchMode):
    """Count the bytes of storages created under this mode that are still alive; ``peak``
    keeps the highest, with the ``phase``, ``module`` and ``grads`` the tracer set then."""

    def __init__(self, real: bool = False, memo: dict[Any, Any] | None = None) -> None:
        super().__init__()
        self.real = real
        self.memo = memo
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
        imports Dynamo; nothing is compiled under this mode."""
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
        key = _memo_key(func, args, kwargs) if self.memo is not None else None
        remembered = self.memo.get(key) if key is not None else None
        if remembered is not None:
            out = _fresh(remembered)
        else:
            out = func(*args, **(kwargs or {}))
            if key is not None:
                self.memo[key] = _layout(out)
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                for plain in _plain_tensors(value):
                    self._count(plain)
        return out


def _plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that hold ``tensor``'s memory: itself, or a wrapper subclass's inner ones.

    A DTensor's storage of the global size holds nothing, and its shard is allocated
    while this mode is off, so the shard is counted here.
    """
    if not is_traceable_wrapper_subclass(tensor):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inner = [getattr(tensor, name) for name in names]
    return [plain for value in inner if isinstance(value, torch.Tensor)
            for plain in _plain_tensors(value)]


def _functional(func: Any) -> bool:
    """Whether ``func`` returns fresh tensors only and changes none of its inputs."""
    schema = func._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


_FUNCTIONAL: dict[Any, bool] = {}


class _Unremembered(Exception):
    """An argument a meta kernel's result may depend on beyond its layout."""


_PLAIN = (int, float, bool, str, torch.dtype, torch.device, torch.layout, torch.memory_format,
          type(None))
_TENSORS = (torch.Tensor, torch.nn.Parameter)  # not subclasses (DTensor, fake tensors)


def _described(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if type(value) not in _TENSORS or not value.is_meta:
            raise _Unremembered
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_described(v) for v in value))
    if isinstance(value, _PLAIN):
        return (type(value), value)
    raise _Unremembered


def _memo_key(func: Any, args: Any, kwargs: Any) -> Any:
    """What a meta kernel's result depends on, or ``None`` when it is not to be remembered."""
    functional = _FUNCTIONAL.get(func)
    if functional is None:
        functional = _FUNCTIONAL[func] = _functional(func)
    if not functional:
        return None
    try:
        return (func, _described(args),
                tuple((k, _described(v)) for k, v in (kwargs or {}).items()))
    except _Unremembered:
        return None


def _layout(out: Any) -> Any:
    """``out`` with each meta tensor as (shape, stride, dtype); ``None``: not reproducible."""
    leaves, spec = tree_flatten(out)
    layout = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if not leaf.is_meta or type(leaf) is not torch.Tensor or leaf.storage_offset():
                return None
            layout.append((tuple(leaf.shape), leaf.stride(), leaf.dtype))
        elif leaf is None or isinstance(leaf, (int, float, bool)):
            layout.append(("value", leaf))
        else:
            return None
    return layout, spec


def _fresh(remembered: Any) -> Any:
    layout, spec = remembered
    return tree_unflatten([torch.empty_strided(v[0], v[1], dtype=v[2], device="meta")
                           if v[0] != "value" else v[1] for v in layout], spec)
