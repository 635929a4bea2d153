"""RMSNorm (float32 statistics, like HF), with an optional fused residual add (vLLM style).

norm(x)            -> rmsnorm(x)
norm(x, residual)  -> (rmsnorm(x + residual), x + residual)

On CPU in fp32, 2-D inputs go through the C++ kernel `kernels.cpu.rms_norm` (one pass per
row); with a residual it works in place, as vLLM's fused_add_rms_norm does: `residual`
becomes x + residual and `x` the normed rows, and both are returned. Callers pass tensors
they own (a layer's fresh output and the running residual) and use only what is returned.
`forward_native` is the torch twin (HF's ops).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu.rms_norm import fused_add_rms_norm_, rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.to(torch.float32)
        variance = xf.pow(2).mean(-1, keepdim=True)
        return self.weight * (xf * torch.rsqrt(variance + self.eps)).to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            out = rms_norm(x, self.weight, self.eps)
            return self._norm(x) if out is None else out
        if fused_add_rms_norm_(x, residual, self.weight, self.eps):
            return x, residual
        return self.forward_native(x, residual)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The torch ops (HF's numerics); new tensors, inputs untouched."""
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
