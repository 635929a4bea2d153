"""Loader and Python entry point of the C++ CPU attention-scores kernel (`attn_scores.cpp`).

The scoring path of KV eviction (H2O, SnapKV, PyramidKV): for each job (a sequence of the
batch), the softmax probabilities its last few query tokens give every cached key, summed over
those queries, per query head, reading K in place through the block table. Its twin is
`workbench.attention.scores.window_probs_torch` (gather + masked softmax); the two agree in
fp32 to within rounding (tests/attention/test_attn_scores.py states the tolerance).

`load()` compiles it on first use (`kernels.cpu.build.CpuExtension`, cached) and returns the
module, or None (WORKBENCH_CPU_KERNELS=0, no compiler, a failed build): callers then run the
twin.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from kernels.cpu import paged_decode
from kernels.cpu.build import CpuExtension

SOURCE = Path(__file__).with_name("attn_scores.cpp")
SUPPORTED_DTYPES = paged_decode.SUPPORTED_DTYPES
EXTENSION = CpuExtension("attn_scores", [SOURCE])


def load() -> ModuleType | None:
    """The compiled extension (exposes `attn_scores`), or None when it cannot be built."""
    return EXTENSION.load()


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """CPU, a float dtype shared by query and cache (never fp8 or a packed integer cache:
    those need their scales, which the twin applies), contiguous head_dim."""
    return paged_decode.supports(query, k_cache) and query.shape[2] == k_cache.shape[3]


def attention_scores(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_start: torch.Tensor,
    q_count: torch.Tensor,
    key_end: torch.Tensor,
    scale: float,
    out_len: int,
) -> torch.Tensor | None:
    """query [T, Hq, D], k_cache [num_blocks, bs, Hkv, D], block_tables [n, W] int64 and
    seq_lens / q_start / q_count / key_end [n] int64 -> float32 [n, Hq, out_len]:
    out[i, h, p] = sum over job i's queries j of softmax_p(scale * q_j . k_p) for
    p < min(key_end[i], out_len); zeros elsewhere. Query j of job i is row q_start[i] + j and
    sits at context position seq_lens[i] - q_count[i] + j (causal). None when the kernel is
    unavailable or does not take these inputs (the caller runs the twin)."""
    if torch.compiler.is_compiling() or not supports(query, k_cache):
        return None
    module = load()
    if module is None:
        return None
    block_tables, _ = paged_decode.index_tensors(block_tables, seq_lens)
    ints = [t.long().contiguous() for t in (seq_lens, q_start, q_count, key_end)]
    ints[3] = ints[3].clamp(max=out_len)
    out = torch.zeros(block_tables.shape[0], query.shape[1], out_len, dtype=torch.float32)
    module.attn_scores(out, query, k_cache, block_tables, *ints, float(scale))
    return out
