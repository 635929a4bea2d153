"""Paged prefill attention: variable-length query chunks of a flat batch against the paged KV.

Sequence i owns query rows [query_start_loc[i], query_start_loc[i+1]) and a context of
seq_lens[i] tokens whose last query_len_i are the new ones (already written to the cache), so
query row j sits at position seq_lens[i] - query_len_i + j and attends to positions 0..that
(causal, bottom-right aligned). That covers a fresh prefill (context = query), a later chunk
of a chunked prefill or a prefix-cache hit (context longer than the query), and decode rows
(query_len 1) in the same batch:

                context positions ->   0 1 2 3 4 5 6 7       seq_len = 8, query_len = 3
    query row 0 (position 5)           x x x x x x . .       (x = attended)
    query row 1 (position 6)           x x x x x x x .
    query row 2 (position 7)           x x x x x x x x

One program per (sequence, block of BLOCK_Q query rows, KV head). GQA: its M = BLOCK_Q * G_PAD
rows are (query row, head of the group) pairs, row m = (m // G_PAD, m % G_PAD), so every K/V
tile is loaded once for the whole group. It walks the context up to its last query's position
in tiles of TILE positions, each read through the block table (`load_paged_kv_tile`), with an
online softmax (FlashAttention): a running max m, a running sum and a rescaled accumulator.
Programs past a sequence's query rows exit at once; rows past query_start_loc[-1] (padding
tokens) belong to no sequence and stay zero.

The grid uses the host's max_query_len, so this path is not for CUDA graphs (decode is).
FP8 cache and dot precision: as in `paged_decode` (dequantize after loading; fp32 ieee dot for
fp32 queries, fp16/bf16 operands with fp32 accumulation otherwise).

`paged_prefill_attention_ref` is the plain-PyTorch twin (per sequence: gather, masked fp32
softmax).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.paged_decode import (
    FP8_DTYPE,
    TILE,
    as_float,
    attention_dot,
    check_fp8_scales,
    check_paged_inputs,
    dot_in_fp32,
    gather_context_ref,
    load_paged_kv_tile,
    online_softmax_update,
)

BLOCK_M = 64  # (query row, group head) pairs per program
NUM_WARPS = 8  # sm_90 ptxas, D 128: ~165 registers (bf16), ~220 (fp32; 4 warps spill)


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # [num_tokens, Hq, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,
    block_tables_ptr,  # [num_seqs, width]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    k_scale_ptr,  # [1] float32 (IS_FP8)
    v_scale_ptr,
    out_ptr,  # [num_tokens, Hq, D]
    scale,
    stride_q_tok, stride_q_head, stride_q_d,
    stride_o_tok, stride_o_head, stride_o_d,
    stride_c_block, stride_c_slot, stride_c_head, stride_c_d,
    stride_bt_seq, stride_bt_col,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query rows per program; BLOCK_Q * GROUP_PAD rows in all
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    if q_block * BLOCK_Q >= q_len:  # this sequence has fewer query rows
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    context_before = seq_len - q_len  # positions before the first query row

    offs_m = tl.arange(0, BLOCK_Q * GROUP_PAD)
    q_row = q_block * BLOCK_Q + offs_m // GROUP_PAD  # query row within the sequence
    g = offs_m % GROUP_PAD
    row_mask = (q_row < q_len) & (g < GROUP)
    heads = kv_head * GROUP + g
    q_pos = context_before + q_row  # this row's context position
    dims = tl.arange(0, HEAD_DIM_PAD)
    dims_mask = dims < HEAD_DIM
    tok = (q_start + q_row).to(tl.int64)
    q = tl.load(
        q_ptr + tok[:, None] * stride_q_tok + heads[:, None] * stride_q_head
        + dims[None, :] * stride_q_d,
        mask=row_mask[:, None] & dims_mask[None, :],
        other=0.0,
    ).to(tl.float32)  # fmt: skip
    k_scale = 1.0
    v_scale = 1.0
    if IS_FP8:
        k_scale = tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq

    # the last query row of this block sees positions up to its own: read no further
    kv_end = tl.minimum(seq_len, context_before + tl.minimum(q_block * BLOCK_Q + BLOCK_Q, q_len))
    m = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for tile_start in range(0, kv_end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        valid = pos < kv_end
        k = load_paged_kv_tile(
            k_cache_ptr, table_ptr, stride_bt_col, pos, valid, kv_head, dims, dims_mask,
            k_scale, stride_c_block, stride_c_slot, stride_c_head, stride_c_d, BLOCK_SIZE, IS_FP8,
        )  # fmt: skip
        v = load_paged_kv_tile(
            v_cache_ptr, table_ptr, stride_bt_col, pos, valid, kv_head, dims, dims_mask,
            v_scale, stride_c_block, stride_c_slot, stride_c_head, stride_c_d, BLOCK_SIZE, IS_FP8,
        )  # fmt: skip
        s = attention_dot(q, tl.trans(k), DOT_FP32, q_ptr.dtype.element_ty) * scale
        causal = valid[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(causal, s, float("-inf"))
        m, denom, acc = online_softmax_update(
            s, v, m, denom, acc, DOT_FP32, q_ptr.dtype.element_ty
        )

    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(
        out_ptr + tok[:, None] * stride_o_tok + heads[:, None] * stride_o_head
        + dims[None, :] * stride_o_d,
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & dims_mask[None, :],
    )  # fmt: skip


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """query [num_tokens, Hq, D] (the flat batch) -> [num_tokens, Hq, D] in the query dtype:
    bottom-right causal softmax(q K^T * scale) V per sequence over its context read through
    block_tables. query_start_loc [num_seqs + 1] (cumulative query lengths), seq_lens
    [num_seqs] (context incl. the new tokens), max_query_len >= every query length (sets the
    grid). An fp8 cache needs k_scale/v_scale ([1] float32 device tensors). Rows past
    query_start_loc[-1] are zeros. `out` (optional, zero-filled by the caller when the batch
    has padding rows) receives the result."""
    check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    check_fp8_scales(key_cache, k_scale, v_scale)
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc {tuple(query_start_loc.shape)} must be [num_seqs + 1] = "
            f"[{num_seqs + 1}]"
        )
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if out is None:
        out = torch.zeros(num_tokens, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if num_seqs == 0 or max_query_len < 1:
        return out
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, BLOCK_M // group_pad)
    is_fp8 = key_cache.dtype == FP8_DTYPE
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        k_scale if is_fp8 else seq_lens, v_scale if is_fp8 else seq_lens,
        out, scale,
        *query.stride(), *out.stride(), *key_cache.stride(), *block_tables.stride(),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        TILE_N=TILE,
        IS_FP8=is_fp8,
        DOT_FP32=dot_in_fp32(query.dtype),
        num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


def paged_prefill_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The twin: per sequence, gather its context through the block table and take an fp32
    softmax(q K^T * scale + bottom-right causal mask) V (query head h reads KV head h // G).
    Rows past query_start_loc[-1] are zeros. Result in the query dtype."""
    check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    num_tokens, num_heads, head_dim = query.shape
    group = num_heads // key_cache.shape[2]
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float32, device=query.device)
    ks, vs = as_float(k_scale), as_float(v_scale)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        start, end = starts[i], starts[i + 1]
        if end == start:
            continue
        k = gather_context_ref(key_cache, block_tables[i], seq_len, ks, query.dtype)
        v = gather_context_ref(value_cache, block_tables[i], seq_len, vs, query.dtype)
        k = k.repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        q_pos = torch.arange(seq_len - (end - start), seq_len, device=query.device)
        visible = torch.arange(seq_len, device=query.device)[None, :] <= q_pos[:, None]
        scores = torch.einsum("qhd,shd->hqs", query[start:end].float(), k) * scale
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start:end] = torch.einsum("hqs,shd->qhd", torch.softmax(scores, dim=-1), v)
    return out.to(query.dtype)
