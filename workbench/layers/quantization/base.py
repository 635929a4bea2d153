"""QuantMethod: how one linear layer stores its quantized weight and runs its forward.

    load fp checkpoint -> LinearBase.weight [out, in] (model dtype)
    quantize_layer     -> the format's tensors replace `weight` (parameters, requires_grad=False,
                          so the memory readout counts them at their real storage size)
    forward            -> layer.quant_method.apply(layer, x, bias)

`layer` is a `workbench.layers.linear.LinearBase`; typed as nn.Module (as vLLM's
QuantizeMethodBase does) so this contract does not import the layer that holds it.

Each format's storage layout and its pure `quantize(w)` / `dequantize(...)` functions live in
`kernels.quant` (the plain-PyTorch references the Triton dequant-GEMM kernels are tested
against); the format modules here import them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn


class QuantMethod(ABC):
    name: str = ""

    def check_model(self, layers: dict[str, nn.Module]) -> None:  # noqa: B027 (optional hook)
        """Raise ValueError naming the first layer (by module name) that cannot take this
        format; called before any layer is changed, so a bad option leaves the model intact."""

    @abstractmethod
    def quantize_layer(self, layer: nn.Module) -> None:
        """Replace the fp `layer.weight` with this format's tensors."""

    @abstractmethod
    def dequantize_layer(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight the forward effectively multiplies by, in `dtype`."""

    @abstractmethod
    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """y = x W^T (+ bias) with the quantized weight; x [..., in] -> [..., out]."""


def replace_weight(layer: nn.Module, **tensors: torch.Tensor) -> None:
    """Drop the fp `weight` parameter and register `tensors` as frozen parameters."""
    del layer.weight
    for name, t in tensors.items():
        layer.register_parameter(name, nn.Parameter(t.contiguous(), requires_grad=False))
