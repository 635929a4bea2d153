"""fp8 W8A8: e4m3 weights with per-output-channel scales, e4m3 activations with dynamic
per-token scales (vLLM's "fp8" online quantization, channel-wise weights / token-wise inputs).

    w_scale[o] = max_i |W[o, i]| / 448          (448 = e4m3's largest finite value)
    W_q        = e4m3(W / w_scale)              round to nearest, 3 mantissa bits
    x_scale[t] = max_i |x[t, i]| / 448          recomputed for every token at every forward
    x_q        = e4m3(x / x_scale)
    y          = (x_q * x_scale) @ (W_q * w_scale).T (+ bias)

On CUDA with compute capability >= 8.9 (FP8 tensor cores) the product runs as
`torch._scaled_mm(x_q, W_q.T, scale_a=x_scale, scale_b=w_scale)` (bf16 out). Elsewhere it is
emulated exactly as written above: both operands dequantized to float32 and multiplied in
float32, so the quantization error can be studied on CPU. A normal e4m3 value is within 2^-4
(half an ulp of 3 mantissa bits) of what it encodes, relatively.

Storage per layer: out * in bytes (weight) + 4 * out bytes (weight_scale).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from workbench.layers.linear import LinearBase
from workbench.layers.quantization.base import QuantMethod, quant_tensor, replace_weight

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0


def _quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row (amax / 448; 1 for an all-zero row): (e4m3 [rows, n], f32 [rows])."""
    tf = t.float()
    amax = tf.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (tf / scale[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (weight e4m3 [out, in], weight_scale float32 [out])."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in], got shape {tuple(w.shape)}")
    return _quantize_rows(w)


def dequantize(
    w_q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(e4m3 [rows, n], scale [rows]) -> w_q * scale in float32, cast to `dtype`."""
    return (w_q.float() * scale[:, None]).to(dtype)


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, in] -> (x_q e4m3 [tokens, in], x_scale float32 [tokens, 1]), per token."""
    x_q, scale = _quantize_rows(x)
    return x_q, scale[:, None]


def scaled_mm_reference(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The float32 emulation: (x_q * x_scale) @ (w_q * w_scale).T + bias, then `out_dtype`."""
    x_deq = x_q.float() * x_scale
    w_deq = w_q.float() * w_scale[:, None]
    y = F.linear(x_deq, w_deq, None if bias is None else bias.float())
    return y.to(out_dtype)


def _has_fp8_tensor_cores(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Method(QuantMethod[LinearBase]):
    name = "fp8"

    def __init__(self) -> None:
        self.use_scaled_mm = True  # switched off (with a warning) if _scaled_mm refuses

    def quantize_layer(self, layer: LinearBase) -> None:
        w_q, scale = quantize(layer.weight.data)
        replace_weight(layer, weight=w_q, weight_scale=scale)

    def dequantize_layer(self, layer: LinearBase, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(layer.weight, quant_tensor(layer, "weight_scale"), dtype)

    def apply(
        self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        lead = x.shape[:-1]
        x_q, x_scale = quantize_activation(x.reshape(-1, x.shape[-1]))
        w_q, w_scale = layer.weight, quant_tensor(layer, "weight_scale")
        y = None
        if self.use_scaled_mm and _has_fp8_tensor_cores(x.device) and (
            w_q.shape[0] % 16 == 0 and w_q.shape[1] % 16 == 0
        ):
            y = self._scaled_mm(x_q, x_scale, w_q, w_scale, bias, x.dtype)
        if y is None:
            y = scaled_mm_reference(x_q, x_scale, w_q, w_scale, bias, x.dtype)
        return y.reshape(*lead, w_q.shape[0])

    def _scaled_mm(
        self,
        x_q: torch.Tensor,
        x_scale: torch.Tensor,
        w_q: torch.Tensor,
        w_scale: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor | None:
        try:  # row-wise scales want a bf16 output; W_q.T is column-major as cuBLASLt asks
            y = torch._scaled_mm(
                x_q, w_q.t(), scale_a=x_scale.contiguous(),
                scale_b=w_scale[None, :].contiguous(), out_dtype=torch.bfloat16,
            )
        except RuntimeError as e:
            self.use_scaled_mm = False
            warnings.warn(
                f"torch._scaled_mm is unavailable here ({e}); fp8 linears fall back to the "
                "float32 emulation", RuntimeWarning, stacklevel=2,
            )
            return None
        y = y.to(out_dtype)
        return y if bias is None else y + bias
