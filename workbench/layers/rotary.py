"""Rotary position embedding (RoPE), neox style (rotate_half), as in HF Llama/Qwen/Mistral.

`get_rope_config(hf_config)` reads rope_theta and the scaling dict from either the
transformers >= 5 layout (`"rope_parameters": {"rope_theta", "rope_type", ...}`) or the old one
(`"rope_theta"` top-level plus `"rope_scaling": {"rope_type" | "type", ...}`).
Supported rope types: "default" and "llama3". The cos/sin table for every position up to
`max_position` is precomputed in float32 and gathered by position at run time. On CPU in fp32
the C++ kernel `kernels.cpu.rotary` applies it in place, bitwise equal to the torch ops.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from kernels.cpu.rotary import rotary_neox_

SUPPORTED_ROPE_TYPES = ("default", "llama3")


def get_rope_config(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope_theta, scaling dict: "rope_type" plus its parameters) from a config.json dict."""
    params = dict(hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", hf_config.get("rope_theta", 10000.0)))
    legacy_type = params.pop("type", "default")
    params["rope_type"] = params.get("rope_type", legacy_type)
    partial = params.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"partial_rotary_factor ({partial}) is not supported; only 1.0")
    return theta, params


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 frequency smoothing (same arithmetic as transformers)."""
    try:
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
    except KeyError as e:
        raise ValueError(f"rope_type 'llama3' needs {e.args[0]!r} in rope_scaling") from None
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * out / factor + smooth * out
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, out)


def compute_inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type ({rope_type!r}) is not supported; supported rope types are "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (base**exponent)
    if rope_type == "llama3":
        assert scaling is not None
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """forward(positions [T], q [T, Hq*D], k [T, Hk*D]) -> rotated (q, k), same shapes."""

    # buffers registered in __init__ (nn.Module types them Tensor | Module)
    cos_cache: torch.Tensor
    sin_cache: torch.Tensor

    def __init__(
        self,
        head_size: int,
        max_position: int,
        base: float,
        rope_scaling: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.head_size = head_size
        inv_freq = compute_inv_freq(head_size, base, rope_scaling)
        t = torch.arange(max_position, dtype=torch.int64).to(torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_size]
        # float32 on purpose; non-persistent so it never appears among checkpoint weights
        self.register_buffer("cos_cache", emb.cos(), persistent=False)
        self.register_buffer("sin_cache", emb.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (q, k). On CPU in fp32 the C++ kernel rotates q and k in place (they are
        views of the fresh QKV projection output); its results equal these ops' bitwise."""
        if not q.requires_grad and rotary_neox_(
            positions, q, k, self.cos_cache, self.sin_cache, self.head_size
        ):
            return q, k
        return self.forward_native(positions, q, k)

    def forward_native(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch ops (HF's q * cos + rotate_half(q) * sin); new tensors, inputs untouched."""
        num_tokens = positions.shape[0]
        cos = self.cos_cache.index_select(0, positions).to(q.dtype).unsqueeze(1)
        sin = self.sin_cache.index_select(0, positions).to(q.dtype).unsqueeze(1)
        q3 = q.view(num_tokens, -1, self.head_size)
        k3 = k.view(num_tokens, -1, self.head_size)
        q_out = q3 * cos + _rotate_half(q3) * sin
        k_out = k3 * cos + _rotate_half(k3) * sin
        return q_out.view(num_tokens, -1), k_out.view(num_tokens, -1)
