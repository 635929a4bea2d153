"""Prepacked fp32 GEMM on CPU: MKL's packed sgemm, one of the linear backends
(`linear_backend.py`), and the entry point that prepares every linear layer's backend.

vLLM's CPU backend prepacks every unquantized linear weight once after loading
(`dispatch_cpu_unquantized_gemm`, with oneDNN). MKL's packing (cblas_sgemm_pack /
cblas_sgemm_compute, reached through torch's `mkl::_mkl_reorder_linear_weight` and
`mkl::_mkl_linear`, what torch.compile's weight freezing uses for fp32 linears) is the `mkl`
backend. Measured on the 2-core AVX-512 box (K=512, N=2816): 1.6x F.linear at 4 rows,
2.3x at 16, 1.4x at 64, 1.1x at 256, none at 2048 and above. Which backend (torch, mkl,
onednn) serves which weight shape and row count is now measured per machine at load
(`linear_autotune.py`, docs/cpu_linear.md); WORKBENCH_CPU_LINEAR_BACKEND forces one.

    pack_linear_weights(model)          give every unquantized fp32 CPU linear and LM head of
                                        `model` its backend plan and packed copy (again after
                                        changing weights in place); returns the packed bytes
    linear(x, weight, bias, packed)     the MKL path alone: the packed GEMM for 2-D batches of
                                        1..PACKED_GEMM_MAX_TOKENS rows, else F.linear
    unavailable_reason(dtype, device)   why MKL packing is off (None when it is on)

A packed copy sits beside the original weight (kept for the buckets that use F.linear, TP
loading and quantization), so it costs memory: the engine reports it as `packed_weight_bytes`
and counts it in the budget's reserve. That figure is the weights' own bytes: MKL's buffer is
allocated larger (1.3x for 4096 x 4096, ~8 MB for a 64 x 64 matrix), but its padding is never
written, so it is not resident (measured: RSS grows by 2.6 MB per packed 1408 x 512 fp32
weight of 2.9 MB, by 0.23 MB per 64 x 64 one). Results equal F.linear's to float rounding (a
different summation order), so greedy tokens can differ from an unpacked run only where two
logits tie to ~1e-6.
WORKBENCH_CPU_PACKED_GEMM=0 turns packing off (the same as WORKBENCH_CPU_LINEAR_BACKEND=torch).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from workbench.layers.linear_autotune import prepare_linear_weights

PACKED_GEMM_MAX_TOKENS = 512  # rows per call up to which the packed weight is used


def unavailable_reason(dtype: torch.dtype, device: torch.device | str) -> str | None:
    """None when weights of `dtype` on `device` get packed, else why not."""
    if os.environ.get("WORKBENCH_CPU_PACKED_GEMM", "1") == "0":
        return "disabled by WORKBENCH_CPU_PACKED_GEMM=0"
    if torch.device(device).type != "cpu":
        return f"device {torch.device(device).type} (packing is for CPU)"
    if dtype != torch.float32:
        return f"dtype {dtype} (MKL's packed sgemm is fp32)"
    if not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear"):
        return "this torch build has no MKL packed GEMM"
    return None


def pack_linear_weights(model: nn.Module) -> int:
    """Set `linear_plan` and `packed_weight` on every unquantized linear layer and LM head of
    `model` (`linear_autotune.prepare_linear_weights`: the measured or cached backend per
    weight shape, or the forced one); returns the memory the packed copies occupy, counted as
    their weights' bytes."""
    return prepare_linear_weights(model)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T + bias: MKL's packed GEMM for a 2-D batch of 1..PACKED_GEMM_MAX_TOKENS rows
    when `packed` is the MKL-packed `weight`, else F.linear. A layer's `packed_weight` may be
    oneDNN's (its plan says which): pass it to `linear_backend.linear` with the plan instead;
    here it is refused (MKL would read it as its own buffer and crash)."""
    rows = x.shape[0]
    if packed is None or x.dim() != 2 or not 0 < rows <= PACKED_GEMM_MAX_TOKENS:
        return F.linear(x, weight, bias)
    if packed.shape == weight.shape:  # MKL's buffer is [bytes-ish, 1]; oneDNN keeps [out, in]
        raise ValueError(
            f"packed ({tuple(packed.shape)}) is not an MKL-packed weight (oneDNN's keeps the "
            "weight's shape); call linear_backend.linear(x, weight, bias, packed, plan)")
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)
