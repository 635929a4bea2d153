"""QuantMethod: how one linear layer stores its quantized weight and runs its forward.

    load fp checkpoint -> LinearBase.weight [out, in] (model dtype)
    quantize_layer     -> the format's tensors replace `weight` (parameters, requires_grad=False,
                          so the memory readout counts them at their real storage size)
    forward            -> layer.quant_method.apply(layer, x, bias)

Each format module also has pure `quantize(w)` / `dequantize(...)` functions: the plain-PyTorch
reference a later Triton dequant-GEMM kernel is tested against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from workbench.layers.linear import LinearBase


class QuantMethod(ABC):
    name: str = ""

    def check_model(self, layers: dict[str, LinearBase]) -> None:  # noqa: B027 (optional hook)
        """Raise ValueError naming the first layer (by module name) that cannot take this
        format; called before any layer is changed, so a bad option leaves the model intact."""

    @abstractmethod
    def quantize_layer(self, layer: LinearBase) -> None:
        """Replace the fp `layer.weight` with this format's tensors."""

    @abstractmethod
    def dequantize_layer(self, layer: LinearBase, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight the forward effectively multiplies by, in `dtype`."""

    @abstractmethod
    def apply(
        self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """y = x W^T (+ bias) with the quantized weight; x [..., in] -> [..., out]."""


def replace_weight(layer: LinearBase, **tensors: torch.Tensor) -> None:
    """Drop the fp `weight` parameter and register `tensors` as frozen parameters."""
    del layer.weight
    for name, t in tensors.items():
        layer.register_parameter(name, nn.Parameter(t.contiguous(), requires_grad=False))
