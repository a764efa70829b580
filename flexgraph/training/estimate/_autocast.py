"""CUDA autocast's dtype rules on meta tensors, which ``torch.autocast`` ignores, so saved
activations have an AMP step's dtypes."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

_LOW = {
    F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
    F.conv_transpose3d, F.scaled_dot_product_attention, F.prelu, torch.matmul, torch.mm,
    torch.bmm, torch.addmm, torch.baddbmm, torch.addbmm, torch.addmv, torch.mv,
    torch.Tensor.matmul, torch.Tensor.mm, torch.Tensor.bmm, torch.Tensor.__matmul__,
    torch.einsum,
}
"""CUDA autocast's lower-precision list (the ops with a memory effect)."""

_FP32 = {
    F.layer_norm, F.group_norm, F.softmax, F.log_softmax, F.cross_entropy, F.nll_loss,
    F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.binary_cross_entropy_with_logits, F.kl_div,
    torch.softmax, torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax,
    torch.exp, torch.log, torch.pow, torch.Tensor.pow, torch.rsqrt, torch.Tensor.rsqrt,
    torch.cumsum, torch.logsumexp, torch.norm, F.normalize,
}
"""CUDA autocast's float32 list (outputs in fp32 whatever the input)."""


class MetaAutocast(TorchFunctionMode):
    """Trace an AMP step: ``with MetaAutocast(torch.float16): loss = model(...)``."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, torch.Tensor] = {}

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        if value.dtype == dtype:
            return value
        if value.is_leaf and value.requires_grad:  # a weight: cast once per forward
            key = id(value)
            if key not in self._cache:
                self._cache[key] = value.to(dtype)
            return self._cache[key]
        return value.to(dtype)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _LOW:
            args, kwargs = tree_map(lambda v: self._cast(v, self.dtype), (args, kwargs))
        elif func in _FP32:
            args, kwargs = tree_map(lambda v: self._cast(v, torch.float32), (args, kwargs))
        return func(*args, **kwargs)

    def __exit__(self, *exc: Any) -> Any:
        self._cache.clear()  # what backward saved stays alive through autograd
        return super().__exit__(*exc)
