"""A model's parameters counted on the meta device, by kind and by module (the largest
layer as DeepSpeed defines it: the most parameters one module holds directly)."""

from __future__ import annotations

from typing import Any

import attrs
from torch import nn

from flexgraph.training.components import unwrap_model


@attrs.frozen
class Census:
    """Parameter counts of one model, in elements (shared parameters counted once)."""

    total: int
    trainable: int
    frozen: int
    param_bytes: int
    largest_layer: int
    largest_param: int
    by_module: tuple[tuple[str, int, int], ...]
    model: Any = attrs.field(eq=False, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "trainable": self.trainable, "frozen": self.frozen,
                "bytes": self.param_bytes, "largest_layer": self.largest_layer,
                "largest_parameter": self.largest_param,
                "by_module": [{"module": name, "total": total, "trainable": trainable}
                              for name, total, trainable in self.by_module]}


def _counts(params: list[nn.Parameter]) -> tuple[int, int]:
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def take_census(model: nn.Module) -> Census:
    """Count ``model``'s parameters (the user's module inside any wrapper)."""
    module = unwrap_model(model)
    params = list(module.parameters())
    total, trainable = _counts(params)
    rows = []
    own = list(module.parameters(recurse=False))
    if own:
        rows.append(("(root)", *_counts(own)))
    for name, child in module.named_children():
        child_total, child_trainable = _counts(list(child.parameters()))
        if child_total:
            rows.append((name, child_total, child_trainable))
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in module.modules()),
                  default=0)
    return Census(total=total, trainable=trainable, frozen=total - trainable,
                  param_bytes=sum(p.numel() * p.element_size() for p in params),
                  largest_layer=largest,
                  largest_param=max((p.numel() for p in params if p.requires_grad), default=0),
                  by_module=tuple(rows), model=module)
