"""SiluAndMul: the SwiGLU gate on a fused gate_up projection, silu(x[:d]) * x[d:]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """In place on the gate half of `x` (the projection output, used once): no new buffer.
    The result is a strided view [.., d] of x, which the next matmul reads as is."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        gate = x[..., :d]
        if torch.is_grad_enabled() and x.requires_grad:
            return F.silu(gate) * x[..., d:]
        return F.silu(gate, inplace=True).mul_(x[..., d:])
