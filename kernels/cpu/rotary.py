"""Loader and Python entry point of the C++ CPU rotary-embedding kernel (`rotary.cpp`).

`rotary_neox_(positions, q, k, cos_cache, sin_cache, head_size)` rotates q and k in place and
returns True, or returns False (touching nothing) when the kernel is unavailable or does not
take the inputs, or while torch.compile traces the caller (inductor generates the twin's ops;
the pybind call and the position range check would break the graph); the caller then runs its
torch twin, `RotaryEmbedding.forward`'s ops, whose results the kernel equals bitwise (built
with -ffp-contract=off; see rotary.cpp).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kernels.cpu.build import CpuExtension

EXTENSION = CpuExtension("rotary", [Path(__file__).with_name("rotary.cpp")],
                         extra_cflags=["-ffp-contract=off"])


def supports(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
             cos_cache: torch.Tensor, head_size: int) -> bool:
    """CPU fp32 q / k of shape [T, heads * head_size] with contiguous rows, int64 positions,
    a contiguous fp32 [P, head_size] table, an even head_size."""
    return (
        q.device.type == "cpu" and k.device.type == "cpu"
        and q.dtype == torch.float32 and k.dtype == torch.float32
        and cos_cache.dtype == torch.float32 and cos_cache.is_contiguous()
        and positions.dtype == torch.int64 and positions.dim() == 1
        and q.dim() == 2 and k.dim() == 2
        and q.shape[0] == k.shape[0] == positions.shape[0]
        and q.stride(1) == 1 and k.stride(1) == 1
        and head_size % 2 == 0 and cos_cache.shape[1] == head_size
        and q.shape[1] % head_size == 0 and k.shape[1] % head_size == 0
    )


def rotary_neox_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 cos_cache: torch.Tensor, sin_cache: torch.Tensor, head_size: int) -> bool:
    """Rotate q and k in place (True), or do nothing (False: use the torch path)."""
    if torch.compiler.is_compiling():
        return False
    if not supports(positions, q, k, cos_cache, head_size) or sin_cache.shape != cos_cache.shape:
        return False
    if positions.numel() and not 0 <= int(positions.min()) <= int(positions.max()) < len(
            cos_cache):
        return False  # the torch path raises the IndexError
    module = EXTENSION.load()
    if module is None:
        return False
    module.rotary_neox_(positions, q, k, cos_cache, sin_cache, head_size)
    return True
