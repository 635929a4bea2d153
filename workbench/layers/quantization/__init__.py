"""Online weight quantization of a loaded model's linear layers (vLLM's `quantization=`).

    load_model: build -> load_weights -> quantize_model(model, "int4", group_size=64)

Every `LinearBase` (qkv_proj, o_proj, gate_up_proj, down_proj in the Llama family) gets the
format's storage and forward; the embeddings, lm_head (not LinearBase) and norms keep the model
dtype, as vLLM leaves them by default.

    format  name   weight storage                          forward
    int8    W8A16  int8 [out, in] + f32 scale [out]        x @ dequant(W).T in x's dtype
    int4    W4A16  uint8 [out, in/2] (2 per byte)          x @ dequant(W).T in x's dtype
                   + f32 scales, zeros [out, in/G]
    fp8     W8A8   e4m3 [out, in] + f32 scale [out]        per-token e4m3 x; _scaled_mm on
                                                           sm89+, exact f32 emulation elsewhere
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.layers.linear import LinearBase
from workbench.layers.quantization.base import QuantMethod
from workbench.layers.quantization.fp8 import Fp8Method
from workbench.layers.quantization.int4 import Int4Method
from workbench.layers.quantization.int8 import Int8Method

QUANT_METHODS: dict[str, type[QuantMethod[LinearBase]]] = {
    "int8": Int8Method,
    "int4": Int4Method,
    "fp8": Fp8Method,
}


def get_quant_method(method_name: str, **opts: Any) -> QuantMethod[LinearBase]:
    """A configured QuantMethod; an unknown name or option is a ValueError naming it."""
    cls = QUANT_METHODS.get(method_name)
    if cls is None:
        raise ValueError(
            f"quantization ({method_name!r}) must be one of {', '.join(map(repr, QUANT_METHODS))}"
        )
    try:
        return cls(**opts)
    except TypeError:
        raise ValueError(
            f"quantization {method_name!r} takes no option(s) {', '.join(sorted(opts))}"
        ) from None


def quantize_model(model: nn.Module, method_name: str, **opts: Any) -> dict[str, LinearBase]:
    """Quantize every (not yet quantized) LinearBase of a loaded model in place.

    All layers are checked before any is changed. Returns the quantized layers by name.
    """
    method = get_quant_method(method_name, **opts)
    layers = {
        name: m for name, m in model.named_modules()
        if isinstance(m, LinearBase) and m.quant_method is None
    }
    method.check_model(layers)
    for layer in layers.values():
        method.quantize_layer(layer)
        layer.quant_method = method
    return layers


__all__ = ["QUANT_METHODS", "QuantMethod", "get_quant_method", "quantize_model"]
