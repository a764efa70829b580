"""Mixed precision on the CPU: MMEngine's ``AmpOptimWrapper`` refuses to be built
without an accelerator, so :class:`CPUAmpOptimWrapper` takes its place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper


class CPUAmpOptimWrapper(AmpOptimWrapper):
    """``AmpOptimWrapper`` for the CPU: ``torch.autocast('cpu')`` + a CPU GradScaler.

    ``dtype`` is bfloat16 by default here; ``loss_scale`` applies to float16 only.
    """

    def __init__(self, loss_scale: Any = "dynamic", dtype: str | torch.dtype | None = None,
                 use_fsdp: bool = False, **kwargs: Any) -> None:
        del use_fsdp
        OptimWrapper.__init__(self, **kwargs)  # skips AmpOptimWrapper's accelerator check
        if isinstance(dtype, str):
            if dtype not in self.valid_dtypes:
                raise ValueError(f"dtype should be one of {self.valid_dtypes}, got {dtype!r}")
            dtype = getattr(torch, dtype)
        self.cast_dtype = dtype or torch.bfloat16
        self._scale_update_param = None
        scaling = self.cast_dtype == torch.float16
        if loss_scale == "dynamic":
            options: dict[str, Any] = {}
        elif isinstance(loss_scale, (int, float)):
            self._scale_update_param = float(loss_scale)
            options = {"init_scale": float(loss_scale)}
        elif isinstance(loss_scale, dict):
            options = dict(loss_scale)
        else:
            raise TypeError(f"loss_scale must be 'dynamic', a float or a dict, got {loss_scale!r}")
        self.loss_scaler = torch.amp.GradScaler("cpu", enabled=scaling, **options)

    @contextmanager
    def optim_context(self, model: torch.nn.Module) -> Iterator[None]:
        with OptimWrapper.optim_context(self, model), torch.autocast("cpu",
                                                                      dtype=self.cast_dtype):
            yield
