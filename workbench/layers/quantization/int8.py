"""int8 W8A16: int8 weights with one symmetric fp32 scale per output channel.

    scale[o] = max_i |W[o, i]| / 127            (1 for an all-zero row)
    q[o, i]  = round(W[o, i] / scale[o])        in [-127, 127], stored int8
    W'[o, i] = q[o, i] * scale[o]               so |W - W'| <= scale[o] / 2
    y        = x @ W'.T (+ bias), W' cast to x's dtype first: activations stay 16/32-bit

Storage per layer: out * in bytes (weight) + 4 * out bytes (weight_scale). Like gpt-fast's
WeightOnlyInt8Linear, with the scale folded into the weight before the matmul so the forward is
exactly `x @ dequantize(q, scale).T`.

Forward path (`use_triton`): on CUDA, `apply` runs the fused Triton kernel
`kernels.triton.dequant_matmul.w8a16_matmul` (dequantizes tiles in registers, fp32 accumulate,
scale applied to the accumulator); elsewhere, or with FORCE_TORCH = True, the plain-PyTorch
`F.linear(x, dequantize(...))` above, which is the reference the kernel is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.layers.linear import LinearBase
from workbench.layers.quantization.base import QuantMethod, replace_weight

QMAX = 127
FORCE_TORCH = False  # True: the plain-PyTorch forward even on CUDA (A/B checks, debugging)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # activations the kernel takes


def use_triton(x: torch.Tensor) -> bool:
    """True when `apply` runs the Triton kernel: x on CUDA in TRITON_DTYPES, FORCE_TORCH off."""
    return x.is_cuda and x.dtype in TRITON_DTYPES and not FORCE_TORCH


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


class Int8Method(QuantMethod):
    name = "int8"

    def quantize_layer(self, layer: LinearBase) -> None:
        q, scale = quantize(layer.weight.data)
        replace_weight(layer, weight=q, weight_scale=scale)

    def dequantize_layer(self, layer: LinearBase, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(layer.weight, layer.weight_scale, dtype)

    def apply(
        self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if use_triton(x):
            from kernels.triton.dequant_matmul import w8a16_matmul  # imports triton: lazily

            return w8a16_matmul(x, layer.weight, layer.weight_scale, bias)
        return F.linear(x, dequantize(layer.weight, layer.weight_scale, x.dtype), bias)
