"""Attention layer: owns one layer's paged KV cache and hands the math to a backend.

`kv_cache` starts empty and is bound by the model runner (`model.bind_kv_cache`) to a tensor
[2, num_blocks, block_size, num_kv_heads, head_dim]. forward() first writes the new tokens' K/V
into that cache, then attends reading K/V back from it (see workbench.attention.backends).
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.attention.backends import AttentionBackend
from workbench.attention.metadata import AttentionMetadata


class Attention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        backend: AttentionBackend,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads "
                f"({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.backend = backend
        self.kv_cache = torch.tensor([])  # plain attribute, not a buffer: bound later

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """q [T, Hq*D], k/v [T, Hkv*D] -> [T, Hq*D]."""
        if self.kv_cache.numel() == 0:
            raise RuntimeError("Attention.kv_cache is not bound; call model.bind_kv_cache() first")
        num_tokens = q.shape[0]
        out = self.backend.forward(
            q.view(num_tokens, self.num_heads, self.head_dim),
            k.view(num_tokens, self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            attn_metadata,
            self.scale,
        )
        return out.view(num_tokens, self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"backend={self.backend.name}"
        )
