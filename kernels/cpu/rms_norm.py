"""Loader and Python entry points of the C++ CPU RMSNorm kernel (`rms_norm.cpp`).

    rms_norm(x, weight, eps)                     -> new tensor, or None (use torch)
    fused_add_rms_norm_(x, residual, weight, eps) -> True after `residual += x;
                                                    x = norm(residual)` in place, or False

Each returns None / False, touching nothing, when the kernel is unavailable or does not take
the inputs (CPU fp32 [T, D] rows with contiguous columns, an fp32 [D] weight), or while
torch.compile traces the caller (a pybind call would break the graph; inductor fuses the twin's
ops instead, vLLM's custom_ops "none" under compilation); the caller then runs its torch twin
(`workbench.layers.norm.RMSNorm`'s ops). The results equal the twin's to the last bit of each
row's scale (the sum of squares is added in another order).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels.cpu.build import CpuExtension

EXTENSION = CpuExtension("rms_norm", [Path(__file__).with_name("rms_norm.cpp")],
                         extra_cflags=["-ffp-contract=off"])


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.device.type == "cpu" and weight.device.type == "cpu"
        and x.dtype == torch.float32 and weight.dtype == torch.float32
        and x.dim() == 2 and x.stride(1) == 1 and x.shape[0] > 0
        and weight.dim() == 1 and weight.is_contiguous() and weight.shape[0] == x.shape[1]
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    if torch.compiler.is_compiling() or not supports(x, weight) or x.requires_grad:
        return None
    module = EXTENSION.load()
    if module is None:
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    module.rms_norm(out, x, weight, float(eps))
    return out


def fused_add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> bool:
    if (torch.compiler.is_compiling() or not supports(x, weight) or x.requires_grad
            or residual.requires_grad
            or residual.shape != x.shape or residual.dtype != x.dtype
            or residual.device != x.device or residual.stride(1) != 1
            or residual.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()):
        return False
    module = EXTENSION.load()
    if module is None:
        return False
    module.fused_add_rms_norm_(x, residual, weight, float(eps))
    return True
