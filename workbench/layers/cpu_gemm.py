"""Prepacked fp32 GEMM on CPU: MKL's packed sgemm for the small-batch (decode) matmuls.

vLLM's CPU backend prepacks every unquantized linear weight once after loading
(`dispatch_cpu_unquantized_gemm`, with oneDNN). Here the packing is MKL's
(cblas_sgemm_pack / cblas_sgemm_compute, reached through torch's `mkl::_mkl_reorder_linear_weight`
and `mkl::_mkl_linear`, what torch.compile's weight freezing uses for fp32 linears). A packed
weight serves any number of rows. Measured on the 2-core AVX-512 box (K=512, N=2816):
1.6x F.linear at 4 rows, 2.3x at 16, 1.4x at 64, 1.1x at 256, none at 2048 and above. So
batches of up to PACKED_GEMM_MAX_TOKENS rows (every decode step, small prefill chunks) use the
packed weight and bigger ones keep F.linear.

    pack_linear_weights(model)          pack every unquantized fp32 CPU linear and LM head of
                                        `model` (again after changing weights in place);
                                        returns the packed bytes (0 when unavailable)
    linear(x, weight, bias, packed)     F.linear, or the packed GEMM when it applies
    unavailable_reason(dtype, device)   why packing is off (None when it is on)

The packed copy sits beside the original weight (kept for large batches, TP loading and
quantization), so it costs memory: the engine reports it as `packed_weight_bytes` and counts
it in the budget's reserve. That figure is the weights' own bytes: MKL's buffer is allocated
larger (1.3x for 4096 x 4096, ~8 MB for a 64 x 64 matrix), but its padding is never written,
so it is not resident (measured: RSS grows by 2.6 MB per packed 1408 x 512 fp32 weight of
2.9 MB, by 0.23 MB per 64 x 64 one). Results equal F.linear's to float rounding (a different
summation order), so greedy tokens can differ from an unpacked run only where two logits tie
to ~1e-6.
WORKBENCH_CPU_PACKED_GEMM=0 turns it off.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

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


def _packable(module: nn.Module) -> bool:
    """A layer opts in by having a `packed_weight` attribute (LinearBase, ParallelLMHead); a
    quantized one (`quant_method` set) keeps its own forward. Duck-typed so this module imports
    none of the layers that call `linear`."""
    return hasattr(module, "packed_weight") and getattr(module, "quant_method", None) is None


def pack_linear_weights(model: nn.Module) -> int:
    """Set `packed_weight` on every unquantized linear layer and LM head of `model` whose
    weight is fp32 on CPU (None elsewhere); returns the memory the packed copies occupy,
    counted as their weights' bytes (see the module docstring)."""
    total = 0
    for module in model.modules():
        if not _packable(module):
            continue
        w = module.weight
        packed = None
        if unavailable_reason(w.dtype, w.device) is None and w.dim() == 2 and w.numel():
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), 64)
            total += w.numel() * w.element_size()
        module.packed_weight = packed
    return total


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T + bias: MKL's packed GEMM for a 2-D batch of 1..PACKED_GEMM_MAX_TOKENS rows
    when `packed` is the packed `weight`, else F.linear."""
    rows = x.shape[0]
    if packed is None or x.dim() != 2 or not 0 < rows <= PACKED_GEMM_MAX_TOKENS:
        return F.linear(x, weight, bias)
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)
