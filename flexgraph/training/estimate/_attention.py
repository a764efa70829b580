"""Attention as a GPU runs it, on meta: ``F.scaled_dot_product_attention`` would fall back
to the math implementation, which keeps the whole score matrix for backward."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_aten = torch.ops.aten


def _fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
           is_causal: bool = False, scale: float | None = None, **_: Any) -> torch.Tensor:
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16):
        return _aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    return _aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


class FusedAttention(TorchFunctionMode):
    """Route ``F.scaled_dot_product_attention`` to the fused kernel CUDA would run."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func is F.scaled_dot_product_attention:
            return _fused(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))
