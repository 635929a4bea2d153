"""Paged decode attention: one query token per sequence, split-KV (FlashDecoding), GQA-grouped.

A decode step reads every sequence's whole K/V context to produce one token, so it is bound by
memory bandwidth, and with few sequences x KV heads there are too few programs to keep the GPU
busy. Split-KV cuts each context into `num_splits` partitions that run in parallel, each an
online-softmax pass (FlashAttention) that leaves a partial output and its log-sum-exp; a small
second kernel merges the partials:

    context of seq i (seq_len tokens, read through block_tables[i] = [b7, b2, b9, ...])
    |---- split 0 ----|---- split 1 ----|---- split 2 ----|      tokens_per_split =
     tile tile tile ...                                             cdiv(cdiv(seq_len, S), TILE)
        | online softmax                                           * TILE (an empty split's
        v                                                           lse is -inf)
    o_0, lse_0          o_1, lse_1        o_2, lse_2
         \\_______________ merge _______________/
    out = sum_s exp(lse_s - max lse) * o_s / sum_s exp(lse_s - max lse)

Stage 1 runs one program per (sequence, KV head, split). GQA: the program loads its KV head's
whole group of G query heads as a [G_PAD, D] tile (G_PAD = max(16, next pow2 of G): tl.dot
wants 16 rows; the extra rows are zeros), so each K/V tile is read once for the group.
Context position p lives in block block_tables[i][p // block_size] at offset p % block_size;
each position of a tile looks its block up, so tiles and blocks need not align and the block
table may be wider than needed (the columns past the context are never read).

CUDA graphs: the grid and buffer sizes come from shapes only (`choose_num_splits` is a function
of the batch size, block-table width, KV heads and the device); seq_lens, block_tables and the
fp8 scales are read on the device. seq_len 0 (a padding row) makes every split empty, and the
merge writes zeros for it, never NaN.

FP8 cache: K/V are loaded as e4m3, converted to fp32 and multiplied by k_scale / v_scale (read
from 1-element float32 device tensors). Math is fp32 (tl.dot with ieee precision) for an fp32
query; for fp16/bf16 queries the dot operands are cast to the query dtype with fp32 accumulation
(the tensor-core path), except bf16 under the interpreter, which computes bf16 wrongly.

KIVI low-bit KV (`paged_decode_attention_kivi`, int8 / int4 / int2, formats in
kernels.quant.kv_kivi): the same split-KV kernel with tiles from `load_kivi_tile`, which reads
each position's block slot (slot_of[block]): a full-precision residual row where the block holds
a slot, else the packed codes (a byte gathered per channel, shifted and masked) times the fp16
scale plus the fp16 zero, in fp32 (keys: per block, head and channel; values: per token, head
and channel group). Its twin is `paged_decode_attention_kivi_ref`.

`paged_decode_attention_ref` is the plain-PyTorch twin (gather through the block table, fp32
softmax): it defines what the kernels compute.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.quant.kv_kivi import dequantize_keys, dequantize_values
from kernels.triton import INTERPRETED

FP8_DTYPE = torch.float8_e4m3fn
TILE = 32  # context positions per inner-loop step (a multiple of 16 for tl.dot)
MAX_SPLITS = 32
MIN_SPLIT_TOKENS = 128  # no split gets a nominal share of the table below this many positions
NUM_WARPS = 8  # sm_90 ptxas: ~120 registers for TILE 32, D 128 (4 warps: ~250), no spills
CPU_NOMINAL_SMS = 4  # without CUDA (the interpreter): a stand-in SM count, so splits still run


def interpret_triton_stdlib() -> None:
    """Under the interpreter, make Triton's standard library (tl.sum, tl.max, tl.zeros, tl.cdiv,
    ...) callable from interpreted kernels even when `triton` was imported before
    TRITON_INTERPRET=1 was set (torch._dynamo imports it, e.g. when transformers loads): those
    functions were then decorated as compiled-mode JITFunctions, which raise "Cannot call
    @triton.jit'd outside of the scope of a kernel". Re-wrap each one as the interpreter's
    `triton.jit` would have; the same object replaces it everywhere, so the interpreter's fast
    paths (`combine_fn == tl.standard._sum_combine`) still match. Idempotent."""
    if not INTERPRETED:
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    wrapped: dict[int, InterpretedFunction] = {}
    for namespace in (tl, tl.standard, tl.core.tensor):
        for name, member in list(vars(namespace).items()):
            if isinstance(member, JITFunction):
                if id(member) not in wrapped:
                    wrapped[id(member)] = InterpretedFunction(member.fn)
                setattr(namespace, name, wrapped[id(member)])


interpret_triton_stdlib()


@triton.jit
def load_paged_kv_tile(
    cache_ptr,  # [num_blocks, block_size, Hkv, D]
    table_ptr,  # this sequence's row of block_tables
    stride_table_col,
    pos,  # [TILE] context positions
    valid,  # [TILE] bool: position inside the context
    kv_head,
    dims,  # [HEAD_DIM_PAD]
    dims_mask,
    kv_scale,  # fp32 scalar (used when IS_FP8)
    stride_c_block, stride_c_slot, stride_c_head, stride_c_d,
    BLOCK_SIZE: tl.constexpr,
    IS_FP8: tl.constexpr,
):  # fmt: skip
    """[TILE, HEAD_DIM_PAD] fp32 K or V rows of positions `pos`, zeros where not valid."""
    block = tl.load(table_ptr + (pos // BLOCK_SIZE) * stride_table_col, mask=valid, other=0)
    offs = (
        block.to(tl.int64)[:, None] * stride_c_block
        + (pos % BLOCK_SIZE)[:, None] * stride_c_slot
        + kv_head * stride_c_head
        + dims[None, :] * stride_c_d
    )
    x = tl.load(cache_ptr + offs, mask=valid[:, None] & dims_mask[None, :], other=0.0)
    x = x.to(tl.float32)
    if IS_FP8:
        x = x * kv_scale
    return x


@triton.jit
def attention_dot(a, b, DOT_FP32: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """a [M, K] @ b [K, N] with fp32 accumulation: exact fp32 (ieee, not tf32) or operands in
    DOT_DTYPE (fp16/bf16 tensor cores)."""
    if DOT_FP32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))


@triton.jit
def online_softmax_update(s, v, m, denom, acc, DOT_FP32: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """One KV tile of FlashAttention's online softmax. s [R, TILE] scaled scores with hidden
    positions at -inf, v [TILE, D]; (m, denom, acc) = running max, sum of exp(s - m) and sum of
    exp(s - m) * v per row. A row with nothing visible yet keeps m = -inf and subtracts 0
    instead (exp(-inf) = 0), so it adds nothing and never produces NaN."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_safe)  # rescales what was summed under the old max
    p = tl.exp(s - m_safe[:, None])
    denom = denom * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + attention_dot(p, v, DOT_FP32, DOT_DTYPE)
    return m_new, denom, acc


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,  # [num_seqs, Hq, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,
    block_tables_ptr,  # [num_seqs, width]
    seq_lens_ptr,  # [num_seqs]
    k_scale_ptr,  # [1] float32 (IS_FP8)
    v_scale_ptr,
    part_out_ptr,  # [num_seqs, Hq, NUM_SPLITS, HEAD_DIM_PAD] float32
    part_lse_ptr,  # [num_seqs, Hq, NUM_SPLITS] float32
    scale,
    stride_q_seq, stride_q_head, stride_q_d,
    stride_c_block, stride_c_slot, stride_c_head, stride_c_d,
    stride_bt_seq, stride_bt_col,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IS_FP8: tl.constexpr,
    DOT_FP32: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    tokens_per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE_N) * TILE_N
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)  # start >= end: an empty split

    rows = tl.arange(0, GROUP_PAD)  # query head kv_head * GROUP + row
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM_PAD)
    dims_mask = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :] * stride_q_d,
        mask=row_mask[:, None] & dims_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    k_scale = 1.0
    v_scale = 1.0
    if IS_FP8:
        k_scale = tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores
    denom = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)  # running sum of exp(score - m) * v
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        valid = pos < end  # every tile holds at least one valid position, so m stays finite
        k = load_paged_kv_tile(
            k_cache_ptr, table_ptr, stride_bt_col, pos, valid, kv_head, dims, dims_mask,
            k_scale, stride_c_block, stride_c_slot, stride_c_head, stride_c_d, BLOCK_SIZE, IS_FP8,
        )  # fmt: skip
        v = load_paged_kv_tile(
            v_cache_ptr, table_ptr, stride_bt_col, pos, valid, kv_head, dims, dims_mask,
            v_scale, stride_c_block, stride_c_slot, stride_c_head, stride_c_d, BLOCK_SIZE, IS_FP8,
        )  # fmt: skip
        s = attention_dot(q, tl.trans(k), DOT_FP32, q_ptr.dtype.element_ty) * scale
        s = tl.where(valid[None, :], s, float("-inf"))  # [GROUP_PAD, TILE_N]
        m, denom, acc = online_softmax_update(
            s, v, m, denom, acc, DOT_FP32, q_ptr.dtype.element_ty
        )

    nonempty = denom > 0
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, denom, 1.0)), float("-inf"))
    out = acc / tl.where(nonempty, denom, 1.0)[:, None]
    part = (seq.to(tl.int64) * (GROUP * tl.num_programs(1)) + heads) * NUM_SPLITS + split
    tl.store(part_lse_ptr + part, lse, mask=row_mask)
    tl.store(
        part_out_ptr + part[:, None] * HEAD_DIM_PAD + dims[None, :],
        out,
        mask=row_mask[:, None],
    )


@triton.jit
def load_kivi_tile(
    codes_ptr,  # [num_blocks, block_size, Hkv, D * BITS / 8] uint8
    scale_ptr,  # float16: keys [num_blocks, Hkv, D], values [num_blocks, block_size, Hkv, NG]
    zero_ptr,
    res_ptr,  # [slots, block_size, Hkv, D] the residual pool (query dtype)
    slot_ptr,  # [num_blocks] int64, -1 = quantized
    table_ptr,  # this sequence's row of block_tables
    stride_table_col,
    pos,  # [TILE] context positions
    valid,  # [TILE] bool
    kv_head,
    dims,  # [HEAD_DIM_PAD]
    dims_mask,
    stride_c_block, stride_c_slot, stride_c_head,
    stride_s_block, stride_s_slot, stride_s_head,  # keys: stride_s_slot = 0
    stride_r_slot, stride_r_tok, stride_r_head,
    BLOCK_SIZE: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,  # channels per scale / zero: 1 for keys, the value group size
):  # fmt: skip
    """[TILE, HEAD_DIM_PAD] fp32 K or V rows of a KIVI cache: the residual's row where the
    block holds a slot, else q * scale + zero (fp32); zeros where not valid."""
    block = tl.load(table_ptr + (pos // BLOCK_SIZE) * stride_table_col, mask=valid, other=0)
    block = block.to(tl.int64)
    off = pos % BLOCK_SIZE
    slot = tl.load(slot_ptr + block, mask=valid, other=-1)
    is_fp = slot >= 0
    quantized = slot < 0
    m2 = valid[:, None] & dims_mask[None, :]
    r_offs = (
        tl.where(is_fp, slot, 0)[:, None] * stride_r_slot
        + off[:, None] * stride_r_tok
        + kv_head * stride_r_head
        + dims[None, :]
    )
    r = tl.load(res_ptr + r_offs, mask=m2 & is_fp[:, None], other=0.0).to(tl.float32)
    PER = 8 // BITS
    c_offs = (
        block[:, None] * stride_c_block
        + off[:, None] * stride_c_slot
        + kv_head * stride_c_head
        + (dims // PER)[None, :]
    )
    byte = tl.load(codes_ptr + c_offs, mask=m2 & quantized[:, None], other=0).to(tl.int32)
    q = (byte >> ((dims % PER) * BITS)[None, :]) & ((1 << BITS) - 1)
    s_offs = (
        block[:, None] * stride_s_block
        + off[:, None] * stride_s_slot
        + kv_head * stride_s_head
        + (dims // GROUP)[None, :]
    )
    qm = m2 & quantized[:, None]
    sc = tl.load(scale_ptr + s_offs, mask=qm, other=0.0).to(tl.float32)
    zp = tl.load(zero_ptr + s_offs, mask=qm, other=0.0).to(tl.float32)
    x = q.to(tl.float32) * sc + zp
    return tl.where(is_fp[:, None], r, x)


@triton.jit
def _paged_decode_kivi_split_kernel(
    q_ptr,  # [num_seqs, Hq, D]
    kc_ptr, vc_ptr,  # codes [num_blocks, block_size, Hkv, D * BITS / 8]
    ks_ptr, kz_ptr,  # [num_blocks, Hkv, D] float16
    vs_ptr, vz_ptr,  # [num_blocks, block_size, Hkv, NG] float16
    rk_ptr, rv_ptr,  # [slots, block_size, Hkv, D]
    slot_ptr,  # [num_blocks] int64
    block_tables_ptr,  # [num_seqs, width]
    seq_lens_ptr,  # [num_seqs]
    part_out_ptr,  # [num_seqs, Hq, NUM_SPLITS, HEAD_DIM_PAD] float32
    part_lse_ptr,  # [num_seqs, Hq, NUM_SPLITS] float32
    scale,
    stride_q_seq, stride_q_head, stride_q_d,
    stride_c_block, stride_c_slot, stride_c_head,
    stride_ks_block, stride_ks_head,
    stride_vs_block, stride_vs_slot, stride_vs_head,
    stride_r_slot, stride_r_tok, stride_r_head,
    stride_bt_seq, stride_bt_col,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BITS: tl.constexpr,
    V_GROUP: tl.constexpr,  # value channels per scale / zero
    DOT_FP32: tl.constexpr,
):  # fmt: skip
    """`_paged_decode_split_kernel` over a KIVI cache (tiles from `load_kivi_tile`)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    tokens_per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), TILE_N) * TILE_N
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    dims = tl.arange(0, HEAD_DIM_PAD)
    dims_mask = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :] * stride_q_d,
        mask=row_mask[:, None] & dims_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    for tile_start in range(start, end, TILE_N):
        pos = tile_start + tl.arange(0, TILE_N)
        valid = pos < end
        k = load_kivi_tile(
            kc_ptr, ks_ptr, kz_ptr, rk_ptr, slot_ptr, table_ptr, stride_bt_col, pos, valid,
            kv_head, dims, dims_mask, stride_c_block, stride_c_slot, stride_c_head,
            stride_ks_block, 0, stride_ks_head, stride_r_slot, stride_r_tok, stride_r_head,
            BLOCK_SIZE, BITS, 1,
        )  # fmt: skip
        v = load_kivi_tile(
            vc_ptr, vs_ptr, vz_ptr, rv_ptr, slot_ptr, table_ptr, stride_bt_col, pos, valid,
            kv_head, dims, dims_mask, stride_c_block, stride_c_slot, stride_c_head,
            stride_vs_block, stride_vs_slot, stride_vs_head, stride_r_slot, stride_r_tok,
            stride_r_head, BLOCK_SIZE, BITS, V_GROUP,
        )  # fmt: skip
        s = attention_dot(q, tl.trans(k), DOT_FP32, q_ptr.dtype.element_ty) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m, denom, acc = online_softmax_update(
            s, v, m, denom, acc, DOT_FP32, q_ptr.dtype.element_ty
        )

    nonempty = denom > 0
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, denom, 1.0)), float("-inf"))
    out = acc / tl.where(nonempty, denom, 1.0)[:, None]
    part = (seq.to(tl.int64) * (GROUP * tl.num_programs(1)) + heads) * NUM_SPLITS + split
    tl.store(part_lse_ptr + part, lse, mask=row_mask)
    tl.store(
        part_out_ptr + part[:, None] * HEAD_DIM_PAD + dims[None, :],
        out,
        mask=row_mask[:, None],
    )


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,  # [num_seqs, Hq, NUM_SPLITS, HEAD_DIM_PAD] float32
    part_lse_ptr,  # [num_seqs, Hq, NUM_SPLITS] float32
    out_ptr,  # [num_seqs, Hq, D]
    stride_o_seq, stride_o_head, stride_o_d,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):  # fmt: skip
    """out = sum_s w_s o_s / sum_s w_s with w_s = exp(lse_s - max lse); zeros when every split
    is empty (seq_len 0)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    base = (seq.to(tl.int64) * tl.num_programs(1) + head) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + splits, mask=splits < NUM_SPLITS, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # all empty: every w_s = 0
    w = tl.exp(lse - lse_max)
    o = tl.load(
        part_out_ptr + (base + splits)[:, None] * HEAD_DIM_PAD + dims[None, :],
        mask=(splits < NUM_SPLITS)[:, None],
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + dims * stride_o_d,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NOMINAL_SMS


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_blocks_per_seq: int, block_size: int,
    device: torch.device,
) -> int:  # fmt: skip
    """Splits per sequence from shapes and the device only (so a CUDA graph replays the same
    grid): enough (sequence, KV head, split) programs for about two per SM, at most MAX_SPLITS,
    and no more than the block-table width allows at MIN_SPLIT_TOKENS positions per split."""
    programs = max(1, num_seqs * num_kv_heads)
    want = triton.cdiv(2 * _num_sms(device), programs)
    table_tokens = max(1, max_blocks_per_seq * block_size)
    return max(1, min(want, MAX_SPLITS, triton.cdiv(table_tokens, MIN_SPLIT_TOKENS)))


def dot_in_fp32(dtype: torch.dtype) -> bool:
    """fp32 dot operands for fp32 queries, and for bf16 under the interpreter (its bf16 is
    wrong); fp16/bf16 operands otherwise."""
    return dtype == torch.float32 or (INTERPRETED and dtype == torch.bfloat16)


def check_paged_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """One clear ValueError for inputs the paged-attention kernels cannot take."""
    if query.dim() != 3 or key_cache.dim() != 4:
        raise ValueError(
            f"query {tuple(query.shape)} must be [tokens, Hq, D] and key_cache "
            f"{tuple(key_cache.shape)} [num_blocks, block_size, Hkv, D]"
        )
    if key_cache.shape != value_cache.shape or key_cache.stride() != value_cache.stride():
        raise ValueError("key_cache and value_cache must have the same shape and strides")
    num_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    if key_cache.shape[3] != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"query heads x head_dim ({num_heads} x {head_dim}) must be a multiple of the "
            f"cache's KV heads x head_dim ({num_kv_heads} x {key_cache.shape[3]})"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != seq_lens.shape[0]:
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} must be [num_seqs, width] with num_seqs "
            f"= len(seq_lens) = {seq_lens.shape[0]}"
        )


def check_fp8_scales(
    key_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> None:
    if key_cache.dtype == FP8_DTYPE and (k_scale is None or v_scale is None):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale (1-element float32 tensors)")


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """query [num_seqs, Hq, D] (sequence i's one new token) -> [num_seqs, Hq, D] in the query
    dtype: softmax(q K^T * scale) V over context positions 0..seq_lens[i]-1 read through
    block_tables[i]. key_cache/value_cache [num_blocks, block_size, Hkv, D]; an fp8 cache
    needs k_scale/v_scale ([1] float32 device tensors). num_splits None: choose_num_splits.
    `out` (optional, [num_seqs, Hq, D], any strides) receives the result."""
    check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    check_fp8_scales(key_cache, k_scale, v_scale)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    if query.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"query has {num_seqs} rows but there are {seq_lens.shape[0]} seq_lens")
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs, num_kv_heads, block_tables.shape[1], block_size, query.device
        )
    if num_splits < 1:
        raise ValueError(f"num_splits ({num_splits}) must be >= 1")
    if out is None:
        out = torch.empty(num_seqs, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    # scratch: sizes from shapes only (a CUDA graph captures these allocations in its pool)
    part_out = torch.empty(
        num_seqs, num_heads, num_splits, head_dim_pad, dtype=torch.float32, device=query.device
    )
    part_lse = part_out.new_empty(num_seqs, num_heads, num_splits)
    is_fp8 = key_cache.dtype == FP8_DTYPE
    _paged_decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, block_tables, seq_lens,
        k_scale if is_fp8 else seq_lens, v_scale if is_fp8 else seq_lens,
        part_out, part_lse, scale,
        *query.stride(), *key_cache.stride(), *block_tables.stride(),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=block_size,
        TILE_N=TILE,
        NUM_SPLITS=num_splits,
        IS_FP8=is_fp8,
        DOT_FP32=dot_in_fp32(query.dtype),
        num_warps=NUM_WARPS,
    )  # fmt: skip
    _merge_splits_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, *out.stride(),
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
    )  # fmt: skip
    return out


def gather_context_ref(
    cache: torch.Tensor, table: torch.Tensor, seq_len: int, scale: float | None, dtype: torch.dtype
) -> torch.Tensor:
    """One sequence's K or V rows [seq_len, Hkv, D] as fp32, read through its block table
    (an fp8 cache is dequantized: float(stored) * scale, rounded to `dtype` like the torch
    backend's dequantize_kv)."""
    block_size = cache.shape[1]
    blocks = table[: -(-seq_len // block_size)].long()
    rows = cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]
    if cache.dtype == FP8_DTYPE:
        rows = (rows.float() * (1.0 if scale is None else scale)).to(dtype)
    return rows.float()


def as_float(x: float | torch.Tensor | None) -> float | None:
    return None if x is None else float(x)


def paged_decode_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The twin: per sequence, gather its context through the block table and take an fp32
    softmax(q K^T * scale) V, the GQA group of query head h being KV head h // G; a sequence
    with seq_len 0 gets zeros. Result in the query dtype."""
    check_paged_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = query.shape
    group = num_heads // key_cache.shape[2]
    out = torch.zeros(num_seqs, num_heads, head_dim, dtype=torch.float32, device=query.device)
    ks, vs = as_float(k_scale), as_float(v_scale)
    for i, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        k = gather_context_ref(key_cache, block_tables[i], seq_len, ks, query.dtype)
        v = gather_context_ref(value_cache, block_tables[i], seq_len, vs, query.dtype)
        k = k.repeat_interleave(group, dim=1)  # [S, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,shd->hs", query[i].float(), k) * scale
        out[i] = torch.einsum("hs,shd->hd", torch.softmax(scores, dim=-1), v)
    return out.to(query.dtype)


def paged_decode_attention_kivi(
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
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`paged_decode_attention` over a KIVI low-bit KV cache (kernels.quant.kv_kivi formats):
    k/v_codes [num_blocks, block_size, Hkv, D * bits / 8] uint8, k_scale / k_zero
    [num_blocks, Hkv, D] and v_scale / v_zero [num_blocks, block_size, Hkv, D / G] float16,
    res_k / res_v [slots, block_size, Hkv, D] read instead for blocks with slot_of >= 0."""
    if bits not in (8, 4, 2):
        raise ValueError(f"bits ({bits}) must be 8, 4 or 2")
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, packed = k_codes.shape
    if packed * (8 // bits) != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"codes {tuple(k_codes.shape)} do not hold {bits}-bit head_dim {head_dim} rows for "
            f"{num_heads} query heads"
        )
    if (k_codes.stride() != v_codes.stride() or res_k.stride() != res_v.stride()
            or k_scale.stride() != k_zero.stride() or v_scale.stride() != v_zero.stride()):
        raise ValueError("K and V codes, scales, zeros and residuals must share strides")
    if num_splits is None:
        num_splits = choose_num_splits(
            num_seqs, num_kv_heads, block_tables.shape[1], block_size, query.device
        )
    if out is None:
        out = torch.empty(num_seqs, num_heads, head_dim, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    part_out = torch.empty(
        num_seqs, num_heads, num_splits, head_dim_pad, dtype=torch.float32, device=query.device
    )
    part_lse = part_out.new_empty(num_seqs, num_heads, num_splits)
    _paged_decode_kivi_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, k_codes, v_codes, k_scale, k_zero, v_scale, v_zero, res_k, res_v, slot_of,
        block_tables, seq_lens, part_out, part_lse, scale,
        *query.stride(), *k_codes.stride()[:3], k_scale.stride(0), k_scale.stride(1),
        *v_scale.stride()[:3], *res_k.stride()[:3], *block_tables.stride(),
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        BLOCK_SIZE=block_size,
        TILE_N=TILE,
        NUM_SPLITS=num_splits,
        BITS=bits,
        V_GROUP=head_dim // v_scale.shape[-1],
        DOT_FP32=dot_in_fp32(query.dtype),
        num_warps=NUM_WARPS,
    )  # fmt: skip
    _merge_splits_kernel[(num_seqs, num_heads)](
        part_out, part_lse, out, *out.stride(),
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
    )  # fmt: skip
    return out


def dequantize_kivi_cache_ref(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, residual: torch.Tensor,
    slot_of: torch.Tensor, bits: int, keys: bool, dtype: torch.dtype,
) -> torch.Tensor:
    """A whole KIVI K or V cache as [num_blocks, block_size, Hkv, D] in `dtype`: dequantized
    codes (fp32, then cast), the residual's rows for blocks holding a slot."""
    if keys:
        x = dequantize_keys(codes, scale, zero, bits)
    else:
        x = dequantize_values(codes, scale, zero, bits)
    fp = slot_of >= 0
    x[fp] = residual[slot_of[fp]].float()
    return x.to(dtype)


def paged_decode_attention_kivi_ref(
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
) -> torch.Tensor:
    """The twin of `paged_decode_attention_kivi`: dequantize the caches, then
    `paged_decode_attention_ref`."""
    k = dequantize_kivi_cache_ref(k_codes, k_scale, k_zero, res_k, slot_of, bits, True,
                                  query.dtype)
    v = dequantize_kivi_cache_ref(v_codes, v_scale, v_zero, res_v, slot_of, bits, False,
                                  query.dtype)
    return paged_decode_attention_ref(query, k, v, block_tables, seq_lens, scale)
