"""A Llama-style decoder (RMSNorm, rotary positions, SwiGLU, causal attention), plain torch.

Llama-2-7B's shapes by default (32 layers of 4096, 32 heads, SwiGLU of 11008,
a 32000-token vocabulary, untied output head: 6.74 B parameters). A plain
``nn.Module`` whose forward takes a dict batch and returns the loss, trained
without MMEngine's ``BaseModel``; the data are random token ids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mmengine.registry import DATASETS, MODELS
from torch import nn
from torch.utils.data import Dataset

__all__ = ["RandomTokens", "SizedLlama"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h = self.attention_norm(x)

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, c // self.heads).transpose(1, 2)

        q, k, v = split(self.wq(h)), split(self.wk(h)), split(self.wv(h))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attn.transpose(1, 2).reshape(b, n, c))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


@MODELS.register_module(force=True)
class SizedLlama(nn.Module):
    """Decoder-only language model; ``forward(input_ids, labels)`` returns the loss."""

    def __init__(self, vocab: int = 32000, dim: int = 4096, layers: int = 32, heads: int = 32,
                 ffn: int = 11008, max_len: int = 4096) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(DecoderLayer(dim, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_len).float(), inv).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        x = self.tok_embeddings(input_ids)
        cos, sin = self.cos[:n].to(x.dtype), self.sin[:n].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


@DATASETS.register_module(force=True)
class RandomTokens(Dataset):
    """``length`` sequences of ``seq_len`` random token ids (next-token labels)."""

    def __init__(self, length: int = 100000, seq_len: int = 4096, vocab: int = 32000) -> None:
        self.length, self.seq_len, self.vocab = length, seq_len, vocab

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        g = torch.Generator().manual_seed(index)
        tokens = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)
        return {"input_ids": tokens[:-1], "labels": tokens[1:]}
