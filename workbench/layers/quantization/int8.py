"""int8 W8A16 as a drop-in linear-layer method (format and references: `kernels.quant.int8`).

    quantize_layer   weight -> int8 `weight` [out, in] + fp32 `weight_scale` [out]
    apply            on CUDA (`use_triton`) the fused Triton kernel
                     `kernels.triton.dequant_matmul.w8a16_matmul` (dequantizes tiles in
                     registers, fp32 accumulate, scale applied to the accumulator); elsewhere,
                     or with FORCE_TORCH = True, `F.linear(x, dequantize(...))`, the reference
                     the kernel is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.quant.int8 import QMAX, TRITON_DTYPES, dequantize, quantize
from workbench.layers.linear import LinearBase
from workbench.layers.quantization.base import QuantMethod, quant_tensor, replace_weight

__all__ = ["QMAX", "TRITON_DTYPES", "Int8Method", "dequantize", "quantize", "use_triton"]

FORCE_TORCH = False  # True: the plain-PyTorch forward even on CUDA (A/B checks, debugging)


def use_triton(x: torch.Tensor) -> bool:
    """True when `apply` runs the Triton kernel: x on CUDA in TRITON_DTYPES, FORCE_TORCH off."""
    return x.is_cuda and x.dtype in TRITON_DTYPES and not FORCE_TORCH


class Int8Method(QuantMethod[LinearBase]):
    name = "int8"

    def quantize_layer(self, layer: LinearBase) -> None:
        q, scale = quantize(layer.weight.data)
        replace_weight(layer, weight=q, weight_scale=scale)

    def dequantize_layer(self, layer: LinearBase, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(layer.weight, quant_tensor(layer, "weight_scale"), dtype)

    def apply(
        self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight_scale = quant_tensor(layer, "weight_scale")
        if use_triton(x):
            from kernels.triton.dequant_matmul import w8a16_matmul  # imports triton: lazily

            return w8a16_matmul(x, layer.weight, weight_scale, bias)
        return F.linear(x, dequantize(layer.weight, weight_scale, x.dtype), bias)
