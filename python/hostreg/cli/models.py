"""Embedded models for ``hostreg stage``: GPT-2-shaped transformers from real ``torch.nn``
modules (token and position embeddings, pre-norm blocks of attention and MLP, final
LayerNorm; the LM head is tied to the token embedding, as GPT-2's is, so it adds no tensor).

Shapes follow the published GPT-2 configurations; ``gpt2`` (the default) has 124.4 M
parameters in 148 fp32 tensors, 0.46 GiB.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .shapes import DEFAULT_MODEL, MODELS, GPTConfig

__all__ = ["DEFAULT_MODEL", "GPT", "MODELS", "GPTConfig", "build"]


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln_1 = nn.LayerNorm(c.width)
        self.c_attn = nn.Linear(c.width, 3 * c.width)
        self.c_proj = nn.Linear(c.width, c.width)
        self.ln_2 = nn.LayerNorm(c.width)
        self.mlp = nn.Sequential(nn.Linear(c.width, 4 * c.width), nn.GELU(), nn.Linear(4 * c.width, c.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab, c.width)
        self.wpe = nn.Embedding(c.positions, c.width)
        self.h = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied LM head


def build(name: str = DEFAULT_MODEL, seed: int = 0) -> GPT:
    """Build the named model (a key of :data:`MODELS`) with seeded random weights.

    Raises ``KeyError`` naming the known models for an unknown name.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    torch.manual_seed(seed)
    return GPT(MODELS[name])
