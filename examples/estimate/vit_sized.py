"""A ViT with timm's / MMPreTrain's shapes, for memory estimates of real model sizes.

``flexgraph plan --estimate`` builds it on the meta device, so its size costs
nothing; only plain torch modules, no MMPreTrain needed. The blocks are
MMPreTrain's ``VisionTransformer`` ones (pre-norm, fused qkv, GELU MLP,
``F.scaled_dot_product_attention`` as MMPreTrain calls it on torch 2); the data
are synthetic ImageNet-sized images (uint8, as a decoded JPEG pipeline hands
them over), normalised by MMEngine's ``ImgDataPreprocessor``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset

__all__ = ["SizedViT", "SyntheticImages"]


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim, eps=1e-6)
        self.ffn = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


@MODELS.register_module(force=True)
class SizedViT(BaseModel):
    """ViT-``arch`` (depth x width: tiny 12 x 192, large 24 x 1024, huge 32 x 1280), linear head."""

    ARCHS = {"tiny": (192, 12, 3, 768), "base": (768, 12, 12, 3072),
             "large": (1024, 24, 16, 4096), "huge": (1280, 32, 16, 5120)}

    def __init__(self, arch: str = "base", img_size: int = 224, patch_size: int = 16,
                 num_classes: int = 1000, with_cp: bool = False,
                 data_preprocessor: dict | None = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.with_cp = with_cp  # MMPreTrain's switch: recompute each block in backward
        dim, depth, heads, mlp = self.ARCHS[arch]
        tokens = (img_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens + 1, dim))
        self.layers = nn.ModuleList(Block(dim, heads, mlp) for _ in range(depth))
        self.ln1 = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, inputs, data_samples=None, mode: str = "tensor"):
        x = self.patch_embed(inputs).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embed
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.with_cp else layer(x)
        logits = self.head(self.ln1(x[:, 0]))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, torch.stack(list(data_samples)))}
        return logits


@DATASETS.register_module(force=True)
class SyntheticImages(Dataset):
    """``length`` random uint8 images of ``size`` x ``size`` with a class label each."""

    def __init__(self, length: int = 1281167, size: int = 224, num_classes: int = 1000) -> None:
        self.length, self.size, self.num_classes = length, size, num_classes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        return {"inputs": image, "data_samples": torch.tensor(index % self.num_classes)}
