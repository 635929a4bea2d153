"""int4 W4A16 as a drop-in linear-layer method (format and references: `kernels.quant.int4`).

    quantize_layer   weight -> packed uint8 `qweight` [out, in / 2] + fp32 `scales`, `zeros`
                     [out, in / G] (G = group_size)
    apply            on CUDA (`use_triton`) the fused Triton kernel
                     `kernels.triton.dequant_matmul.w4a16_matmul` (nibbles unpacked and group
                     scale/zero applied in registers, fp32 accumulate); elsewhere, or with
                     FORCE_TORCH = True, `F.linear(x, dequantize(...))`, the reference the kernel
                     is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.quant.int4 import (
    QMAX,
    TRITON_DTYPES,
    check_group_size_value,
    dequantize,
    pack,
    quantize,
    unpack,
)
from workbench.layers.linear import LinearBase
from workbench.layers.quantization.base import QuantMethod, quant_tensor, replace_weight

__all__ = [
    "QMAX", "TRITON_DTYPES", "Int4Method", "dequantize", "pack", "quantize", "unpack",
    "use_triton",
]

FORCE_TORCH = False  # True: the plain-PyTorch forward even on CUDA (A/B checks, debugging)


def use_triton(x: torch.Tensor) -> bool:
    """True when `apply` runs the Triton kernel: x on CUDA in TRITON_DTYPES, FORCE_TORCH off."""
    return x.is_cuda and x.dtype in TRITON_DTYPES and not FORCE_TORCH


class Int4Method(QuantMethod[LinearBase]):
    name = "int4"

    def __init__(self, group_size: int = 128) -> None:
        self.group_size = group_size

    def check_model(self, layers: dict[str, LinearBase]) -> None:
        check_group_size_value(self.group_size)
        bad = [name for name, layer in layers.items() if layer.input_size % self.group_size]
        if bad:
            layer = layers[bad[0]]
            fits = [g for g in (32, 64, 128) if all(m.input_size % g == 0 for m in layers.values())]
            hint = f"; {' or '.join(map(str, fits))} would fit every layer" if fits else ""
            raise ValueError(
                f"quantization_group_size ({self.group_size}) must divide the in_features of "
                f"every quantized linear layer, but {bad[0]} has in_features "
                f"{layer.input_size} ({len(bad)} of {len(layers)} layers do not fit){hint}"
            )

    def quantize_layer(self, layer: LinearBase) -> None:
        qweight, scales, zeros = quantize(layer.weight.data, self.group_size)
        replace_weight(layer, qweight=qweight, scales=scales, zeros=zeros)

    def dequantize_layer(self, layer: LinearBase, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(*_packed(layer), dtype)

    def apply(
        self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        qweight, scales, zeros = _packed(layer)
        if use_triton(x):
            from kernels.triton.dequant_matmul import w4a16_matmul  # imports triton: lazily

            return w4a16_matmul(x, qweight, scales, zeros, self.group_size, bias)
        return F.linear(x, dequantize(qweight, scales, zeros, x.dtype), bias)


def _packed(layer: LinearBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (qweight, scales, zeros) `quantize_layer` registered on `layer`."""
    return (quant_tensor(layer, "qweight"), quant_tensor(layer, "scales"),
            quant_tensor(layer, "zeros"))
