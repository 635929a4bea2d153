"""QuantMethod: how one linear layer stores its quantized weight and runs its forward.

    load fp checkpoint -> LinearBase.weight [out, in] (model dtype)
    quantize_layer     -> the format's tensors replace `weight` (parameters, requires_grad=False,
                          so the memory readout counts them at their real storage size)
    forward            -> layer.quant_method.apply(layer, x, bias)

`layer` is a `workbench.layers.linear.LinearBase`: the formats derive from
`QuantMethod[LinearBase]`, so this contract does not import the layer that holds it (vLLM's
QuantizeMethodBase takes an nn.Module). The tensors `quantize_layer` registers (`weight_scale`,
`qweight`, ...) are not LinearBase attributes: `quant_tensor` reads them as tensors.

Each format's storage layout and its pure `quantize(w)` / `dequantize(...)` functions live in
`kernels.quant` (the plain-PyTorch references the Triton dequant-GEMM kernels are tested
against); the format modules here import them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar, cast

import torch
from torch import nn

LayerT = TypeVar("LayerT", bound=nn.Module)  # the layer a method serves: LinearBase


class QuantMethod(ABC, Generic[LayerT]):
    name: str = ""

    def check_model(self, layers: dict[str, LayerT]) -> None:  # noqa: B027 (optional hook)
        """Raise ValueError naming the first layer (by module name) that cannot take this
        format; called before any layer is changed, so a bad option leaves the model intact."""

    @abstractmethod
    def quantize_layer(self, layer: LayerT) -> None:
        """Replace the fp `layer.weight` with this format's tensors."""

    @abstractmethod
    def dequantize_layer(self, layer: LayerT, dtype: torch.dtype) -> torch.Tensor:
        """The [out, in] weight the forward effectively multiplies by, in `dtype`."""

    @abstractmethod
    def apply(
        self, layer: LayerT, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """y = x W^T (+ bias) with the quantized weight; x [..., in] -> [..., out]."""


def replace_weight(layer: nn.Module, **tensors: torch.Tensor) -> None:
    """Drop the fp `weight` parameter and register `tensors` as frozen parameters."""
    del layer.weight
    for name, t in tensors.items():
        layer.register_parameter(name, nn.Parameter(t.contiguous(), requires_grad=False))


def quant_tensor(layer: nn.Module, name: str) -> torch.Tensor:
    """`layer.<name>`, a parameter `replace_weight` registered (e.g. `weight_scale`)."""
    # nn.Module types a registered attribute as Tensor | Module; replace_weight registered a
    # Parameter under this name
    return cast(torch.Tensor, getattr(layer, name))
