"""A small Vision Transformer on scikit-learn's digits, for the FSDP and DeepSpeed examples.

MMPreTrain's sharded configs (ViT-huge/large under FSDP or DeepSpeed ZeRO) need
ImageNet and GPUs. This is the same kind of model at laptop size: 8x8 digits
cut into 4x4 patches (4 tokens), a class token, learned positional embeddings
and pre-norm transformer blocks, trained through MMEngine's ``BaseModel``
contract. Its ``init_weights`` sets the bare parameters (class token,
positional embedding) the way MMPreTrain's ``VisionTransformer`` does, so the
model can be built on the meta device and initialised after sharding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from digits import _stack
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from torch import nn

__all__ = ["DigitsViT", "TransformerBlock"]


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and MLP, each with a residual connection."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


@MODELS.register_module(force=True)
class DigitsViT(BaseModel):
    """ViT for 8x8 digits: ``depth`` blocks of width ``dim``, 10 classes."""

    def __init__(self, dim: int = 64, depth: int = 4, heads: int = 4, patch: int = 4,
                 data_preprocessor: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.patch = patch
        tokens = (8 // patch) ** 2
        self.embed = nn.Linear(patch * patch, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, inputs, labels=None, mode: str = "tensor"):
        images = _stack(inputs).view(-1, 8 // self.patch, self.patch, 8 // self.patch, self.patch)
        patches = images.permute(0, 1, 3, 2, 4).flatten(1, 2).flatten(2)
        x = self.embed(patches)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x[:, 0]))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits.float(), _stack(labels))}
        if mode == "predict":
            preds = logits.argmax(dim=1).tolist()
            return [{"pred": p, "label": int(t)} for p, t in zip(preds, _stack(labels).tolist(),
                                                                 strict=True)]
        return logits
