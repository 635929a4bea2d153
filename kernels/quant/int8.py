"""int8 W8A16: int8 weights with one symmetric fp32 scale per output channel.

    scale[o] = max_i |W[o, i]| / 127            (1 for an all-zero row)
    q[o, i]  = round(W[o, i] / scale[o])        in [-127, 127], stored int8
    W'[o, i] = q[o, i] * scale[o]               so |W - W'| <= scale[o] / 2
    y        = x @ W'.T (+ bias), W' cast to x's dtype first: activations stay 16/32-bit

Storage per layer: out * in bytes (weight) + 4 * out bytes (weight_scale). Like gpt-fast's
WeightOnlyInt8Linear, with the scale folded into the weight before the matmul so the forward is
exactly `x @ dequantize(q, scale).T`.
"""

from __future__ import annotations

import torch

QMAX = 127
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # activations the kernel takes


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] (any float dtype) -> (q int8 [out, in], scale float32 [out])."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(w.shape)}")
    wf = w.float()
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(wf / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(q int8 [out, in], scale [out]) -> q * scale in float32, then cast to `dtype`."""
    return (q.float() * scale[:, None]).to(dtype)
