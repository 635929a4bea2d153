"""Loader and Python entry point of the C++ CPU paged-attention decode kernel.

`paged_decode.cpp` (beside this file) reads K/V rows in place through the block table, one
query token per sequence, exact online softmax in fp32; its twin is the gather + SDPA decode
of `workbench.attention.torch_backend`. `load()` compiles it on first use
(`kernels.cpu.build.CpuExtension`: g++ -O3 -march=native -fopenmp, cached) and returns the
module, or None when it cannot (WORKBENCH_CPU_KERNELS=0, no C++ compiler, a failed build).
`paged_decode_kivi_attention` is the same kernel over a KIVI low-bit KV cache (int8 / int4 /
int2 codes dequantized as they are read; full-precision residual blocks read as they are).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from kernels.cpu.build import CpuExtension

SOURCE = Path(__file__).with_name("paged_decode.cpp")
SIMD_HEADER = Path(__file__).with_name("simd_f32.h")  # joined in front of SOURCE
SOURCES = [SIMD_HEADER, SOURCE]
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
EXTENSION = CpuExtension("paged_decode", SOURCES)


def unavailable_reason() -> str | None:
    """Why load() returns None (None while it has not been tried or succeeded)."""
    return EXTENSION.unavailable_reason()


def load() -> ModuleType | None:
    """The compiled extension (exposes `paged_decode`), or None when it cannot be built."""
    return EXTENSION.load()


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes these inputs (CPU, a supported dtype, contiguous head_dim).

    An FP8 (float8_e4m3fn) cache is declined: the kernel knows no k_scale/v_scale, so the
    caller's torch path (gather, dequantize, SDPA) serves it."""
    return (
        query.device.type == "cpu"
        and k_cache.device.type == "cpu"
        and query.dtype in SUPPORTED_DTYPES
        and k_cache.dtype in SUPPORTED_DTYPES  # not fp8
        and k_cache.dtype == query.dtype
        and query.dim() == 3
        and k_cache.dim() == 4
        and query.shape[1] % k_cache.shape[2] == 0
        and query.stride(2) == 1
        and k_cache.stride(3) == 1
    )


def index_tensors(block_tables: torch.Tensor, seq_lens: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' index inputs: int64 block tables with unit-stride rows, int64 lengths
    (the inputs themselves when they already are)."""
    if block_tables.dtype != torch.long:
        block_tables = block_tables.long()
    if block_tables.shape[1] and block_tables.stride(1) != 1:
        block_tables = block_tables.contiguous()
    if seq_lens.dtype != torch.long:
        seq_lens = seq_lens.long()
    return block_tables, seq_lens


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    split_tokens: int = -1,
) -> torch.Tensor | None:
    """One decode token per sequence: query [n, Hq, D], k/v_cache [num_blocks, bs, Hkv, D],
    block_tables [n, W] int64, seq_lens [n] int64 -> out [n, Hq, D] in query's dtype, or None
    when the kernel is unavailable or does not take these inputs (the caller falls back).

    bf16 / fp16 are upcast to fp32 inside the kernel. `split_tokens`: -1 splits long contexts
    across threads when (sequence, kv head) pairs are too few; 0 never splits; > 0 forces
    splits of that many tokens (rounded up to whole blocks; for tests)."""
    if not supports(query, k_cache) or v_cache.shape != k_cache.shape:
        return None
    module = load()
    if module is None:
        return None
    block_tables, seq_lens = index_tensors(block_tables, seq_lens)
    out = torch.empty(query.shape, dtype=query.dtype)
    module.paged_decode(
        out, query, k_cache, v_cache, block_tables, seq_lens, float(scale), int(split_tokens)
    )
    return out


def paged_decode_kivi_attention(
    query: torch.Tensor,
    k_codes: torch.Tensor,
    v_codes: torch.Tensor,
    k_scale: torch.Tensor,
    k_zero: torch.Tensor,
    v_scale: torch.Tensor,
    v_zero: torch.Tensor,
    res_k: torch.Tensor,
    res_v: torch.Tensor,
    slot_of: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    bits: int,
    split_tokens: int = -1,
) -> torch.Tensor | None:
    """Decode over a KIVI low-bit KV cache (kernels.quant.kv_kivi formats), reading the codes in
    place: query [n, Hq, D]; k/v_codes [num_blocks, bs, Hkv, D * bits / 8] uint8; k_scale /
    k_zero [num_blocks, Hkv, D] and v_scale / v_zero [num_blocks, bs, Hkv, D / G] float16;
    res_k / res_v [slots, bs, Hkv, D] in the query dtype, read instead of the codes for every
    block with slot_of[block] >= 0 ([num_blocks] int64). Returns [n, Hq, D], or None when the
    kernel is unavailable or does not take these inputs (the caller falls back to its twin,
    `workbench.attention.kivi_attention.decode_kivi_torch`)."""
    if (
        query.device.type != "cpu"
        or query.dtype not in SUPPORTED_DTYPES
        or res_k.dtype != query.dtype
        or query.dim() != 3
        or query.stride(2) != 1
    ):
        return None
    module = load()
    if module is None:
        return None
    block_tables, seq_lens = index_tensors(block_tables, seq_lens)
    out = torch.empty(query.shape, dtype=query.dtype)
    module.paged_decode_kivi(
        out, query, k_codes, v_codes, k_scale, k_zero, v_scale, v_zero, res_k, res_v,
        slot_of.contiguous(), block_tables, seq_lens, int(bits), float(scale), int(split_tokens),
    )
    return out
