"""Plain-PyTorch paged attention: the reference twin of any fused kernel, fast enough on CPU.

Per layer: (1) scatter the new K/V rows into the cache at `slot_mapping`; (2) attend.

    decodes  (query_len == 1): on CPU, the C++ kernel `kernels.cpu.paged_decode` when it builds
             (reads K/V in place through the block table, no gather; USE_CPU_DECODE_KERNEL
             or WORKBENCH_CPU_KERNELS=0 switch it off). Otherwise, and as its reference twin:
             sorted longest context first and cut into chunks of about
             DECODE_CHUNK_BYTES of K+V; each chunk does one batched gather of its sequences'
             blocks, kv_cache[0].view(num_blocks, -1)[block_tables[d, :nb]] ->
             [n, nb*bs, Hkv, D] with nb its own longest context, then one SDPA with q viewed
             as [n, Hkv, G, D] (GQA group = the "query" axis) and a mask `pos < seq_len`;
    prefills (query_len > 1): per sequence, gather its ceil(seq_len / bs) blocks and run SDPA
             with enable_gqa; is_causal when the context is just the query, else an explicit
             bottom-right causal mask (query j sits at seq_len - query_len + j).

FP8 KV cache (kv_cache dtype float8_e4m3fn, scales from `get_kv_scales`, 1.0 when none):
writes store `quantize_kv(x, scale)` = e4m3(clamp(x / scale, +-448)) through a uint8 view
(CPU torch has no fp8 index_copy_); reads gather the fp8 blocks and `dequantize_kv` them
(fp32 multiply by the scale, then the query dtype) before SDPA, so attention equals attention
on the dequantized cache. The C++ decode kernel declines fp8 caches: decodes take the torch
path. With `calibrate` set, a layer's first write sets its scales to amax / 448 first.

KV compression: with `md.kv_scores` set, each layer records its attention scores right after
its write (`workbench.attention.scores`, a read-only pass over K); with `md.layer_metadata`,
a layer attends with its own metadata (`md.for_layer(kv_cache)`: per-layer block tables).

The plan (index tensors, masks) depends only on the metadata and the block size, so it is
built from the host-side `*_cpu` lists once per batch and reused by every layer. It is keyed on
the metadata object (and its host lists): build a new AttentionMetadata for every forward
rather than mutating one in place.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.cpu.paged_decode import paged_decode_attention
from workbench.attention.backends import AttentionBackend
from workbench.attention.kivi_attention import cpu_kivi_decode, forward_kivi, is_kivi_kv
from workbench.attention.metadata import (
    FP8_KV_DTYPE,
    AttentionMetadata,
    KVCacheScales,
    get_kv_scales,
    is_fp8_kv,
)
from workbench.core.kv_cache.utils import FP8_E4M3_MAX, fp8_kv_scale

# CPU decodes use the C++ paged-decode kernel when it builds (else the torch path below, which
# stays its reference twin). Tests flip this to compare the two.
USE_CPU_DECODE_KERNEL = os.environ.get("WORKBENCH_CPU_KERNELS", "1") != "0"

# Decode gathers K+V for this many bytes of sequences at a time (about an L2 cache's worth):
# gather-then-read while hot is ~3x faster on CPU than one batch-wide gather.
DECODE_CHUNK_BYTES = 4 << 20


@dataclass
class _DecodePlan:
    rows: slice | torch.Tensor  # rows of the flat batch holding the decode tokens
    num_seqs: int
    tables: torch.Tensor  # [num_seqs, num_blocks] block ids, sequences longest first
    num_blocks: int  # blocks of the longest decode context
    nbs: list[int]  # blocks each sequence needs, longest first (chunks gather only these)
    mask: torch.Tensor  # [num_seqs, 1, 1, num_blocks * block_size] bool, True = attend
    order: torch.Tensor | None  # sorted position j holds decode sequence order[j]; None = same
    kernel_tables: torch.Tensor  # [num_seqs, num_blocks] block ids in batch (row) order
    kernel_seq_lens: torch.Tensor  # [num_seqs] int64 in batch (row) order


@dataclass
class _PrefillPlan:
    start: int  # rows [start, end) of the flat batch
    end: int
    seq_len: int
    block_ids: torch.Tensor  # [ceil(seq_len / block_size)] int64
    mask: torch.Tensor | None  # [query_len, seq_len] bool; None = plain causal


@dataclass
class _Plan:
    block_size: int
    query_lens: list[int]  # copies of the metadata's host lists, to detect in-place reuse
    seq_lens: list[int]
    num_valid_tokens: int  # tokens owned by sequences; the rest of the batch is padding
    write_slots: torch.Tensor  # slot_mapping with -1 redirected to slot 0 (null block)
    write_valid: torch.Tensor  # [num_tokens, 1, 1] bool, slot_mapping >= 0
    all_valid: bool  # no padding row: writes need no masking
    decode: _DecodePlan | None
    prefills: list[_PrefillPlan]


def _rows(indices: list[int], device: torch.device) -> slice | torch.Tensor:
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return slice(indices[0], indices[0] + len(indices))
    return torch.tensor(indices, dtype=torch.long, device=device)


def build_plan(md: AttentionMetadata, block_size: int) -> _Plan:
    """Everything the layers need that depends only on this batch's metadata."""
    device = md.slot_mapping.device
    starts = [0, *itertools.accumulate(md.query_lens_cpu)]
    max_blocks = md.block_tables.shape[1]

    def blocks_for(seq_len: int) -> int:
        nb = -(-seq_len // block_size)
        if nb > max_blocks:
            raise ValueError(
                f"seq_len ({seq_len}) needs {nb} blocks of {block_size} but block_tables has "
                f"only {max_blocks} columns"
            )
        return nb

    dec = [i for i, q in enumerate(md.query_lens_cpu) if q == 1]
    decode = None
    if dec:
        # Longest context first: a chunk of sequences then gathers only as many blocks as
        # its own longest member needs, not the batch's longest.
        lens = [md.seq_lens_cpu[i] for i in dec]
        perm = sorted(range(len(dec)), key=lambda j: -lens[j])
        identity = perm == list(range(len(dec)))
        nb = blocks_for(lens[perm[0]])
        if len(dec) == md.num_seqs:
            k_tables, k_seq_lens = md.block_tables[:, :nb], md.seq_lens
        else:
            idx = torch.tensor(dec, dtype=torch.long, device=device)
            k_tables = md.block_tables.index_select(0, idx)[:, :nb]
            k_seq_lens = md.seq_lens.index_select(0, idx)
        if identity:
            tables, seq_lens = k_tables, k_seq_lens
        else:
            idx = torch.tensor(perm, dtype=torch.long, device=device)
            tables, seq_lens = k_tables.index_select(0, idx), k_seq_lens.index_select(0, idx)
        pos = torch.arange(nb * block_size, device=device)
        decode = _DecodePlan(
            rows=_rows([starts[i] for i in dec], device),
            num_seqs=len(dec),
            tables=tables,
            num_blocks=nb,
            nbs=[-(-lens[j] // block_size) for j in perm],
            mask=(pos[None, :] < seq_lens[:, None]).view(len(dec), 1, 1, -1),
            order=None if identity else torch.tensor(perm, dtype=torch.long, device=device),
            kernel_tables=k_tables,
            kernel_seq_lens=k_seq_lens,
        )
    prefills = []
    for i, q_len in enumerate(md.query_lens_cpu):
        if q_len < 2:
            continue
        seq_len = md.seq_lens_cpu[i]
        mask = None
        if seq_len != q_len:
            q_pos = torch.arange(seq_len - q_len, seq_len, device=device)
            mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
        block_ids = md.block_tables[i, : blocks_for(seq_len)]
        prefills.append(_PrefillPlan(starts[i], starts[i + 1], seq_len, block_ids, mask))
    valid = md.slot_mapping >= 0
    return _Plan(
        block_size=block_size,
        query_lens=list(md.query_lens_cpu),
        seq_lens=list(md.seq_lens_cpu),
        num_valid_tokens=starts[-1],
        write_slots=torch.where(valid, md.slot_mapping, 0),
        write_valid=valid.view(-1, 1, 1),
        all_valid=bool(valid.all()),
        decode=decode,
        prefills=prefills,
    )


_UNIT_SCALES = KVCacheScales()


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """K or V rows -> float8_e4m3fn: e4m3(clamp(float(x) / scale, -448, 448)) (round to
    nearest even; values past the range saturate instead of becoming NaN)."""
    return (x.float() / scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """float8_e4m3fn rows -> `dtype`: float32(x) * scale, then cast (exact for fp32)."""
    return x.float().mul_(scale).to(dtype)


def kv_scales_of(kv_cache: torch.Tensor) -> KVCacheScales:
    return get_kv_scales(kv_cache) or _UNIT_SCALES


def calibrate_kv_scales(
    key: torch.Tensor, value: torch.Tensor, scales: KVCacheScales, plan: _Plan
) -> None:
    """scales <- amax(|K|) / 448, amax(|V|) / 448 over the batch's real tokens (padding rows
    excluded); a batch with no real token leaves the flag set for the next one."""
    if plan.num_valid_tokens == 0 or not bool(plan.write_valid.any()):
        return
    amax = [float(torch.where(plan.write_valid, x.abs(), 0).amax()) for x in (key, value)]
    scales.k_scale, scales.v_scale = fp8_kv_scale(amax[0]), fp8_kv_scale(amax[1])
    scales.calibrate = False


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, plan: _Plan) -> None:
    """Scatter new K/V rows into the cache; padding rows (slot -1) rewrite slot 0's own value,
    so nothing observable changes (block 0 is the null block, never a real write target)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if is_fp8_kv(kv_cache):
        scales = kv_scales_of(kv_cache)
        if scales.calibrate:
            calibrate_kv_scales(key, value, scales, plan)
        for cache, new, s in ((kv_cache[0], key, scales.k_scale),
                              (kv_cache[1], value, scales.v_scale)):
            flat = cache.view(-1, num_kv_heads, head_dim).view(torch.uint8)
            new = torch.where(plan.write_valid, quantize_kv(new, s).view(torch.uint8), flat[0])
            flat.index_copy_(0, plan.write_slots, new)
        return
    for cache, new in ((kv_cache[0], key), (kv_cache[1], value)):
        flat = cache.view(-1, num_kv_heads, head_dim)
        if not plan.all_valid:
            new = torch.where(plan.write_valid, new, flat[0])
        flat.index_copy_(0, plan.write_slots, new.to(flat.dtype))


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self._plan_md: AttentionMetadata | None = None  # strong ref: its id cannot be reused
        self._plan: _Plan | None = None
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def get_plan(self, md: AttentionMetadata, block_size: int) -> _Plan:
        plan = self._plan
        if (
            plan is None
            or self._plan_md is not md
            or plan.block_size != block_size
            or plan.seq_lens != md.seq_lens_cpu
            or plan.query_lens != md.query_lens_cpu
        ):
            plan = build_plan(md, block_size)
            self._plan_md, self._plan = md, plan
        return plan

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        _, num_blocks_total, block_size, num_kv_heads, _ = kv_cache.shape
        kv_scores = attn_metadata.kv_scores  # KV compression (workbench.attention.scores)
        attn_metadata = attn_metadata.for_layer(kv_cache)  # per-layer tables, if any
        if is_kivi_kv(kv_cache):  # int8 / int4 / int2 KV: workbench.attention.kivi_attention
            return forward_kivi(query, key, value, kv_cache, attn_metadata, scale,
                                cpu_kivi_decode if USE_CPU_DECODE_KERNEL else None)
        plan = self.get_plan(attn_metadata, block_size)
        write_kv(key, value, kv_cache, plan)
        if kv_scores is not None:
            kv_scores.record(query, kv_cache, attn_metadata, scale)
        k_blocks = kv_cache[0].view(num_blocks_total, -1)
        v_blocks = kv_cache[1].view(num_blocks_total, -1)

        dp = plan.decode
        if dp is not None and not plan.prefills and dp.num_seqs == num_tokens:
            return self._decode(query, kv_cache, dp, scale)
        fill = torch.empty if plan.num_valid_tokens == num_tokens else torch.zeros
        out = fill(num_tokens, num_heads, head_dim, dtype=query.dtype, device=query.device)
        if dp is not None:
            out[dp.rows] = self._decode(query[dp.rows], kv_cache, dp, scale)
        scales = kv_scales_of(kv_cache) if is_fp8_kv(kv_cache) else None
        for pp in plan.prefills:
            kb = k_blocks.index_select(0, pp.block_ids).view(-1, num_kv_heads, head_dim)
            vb = v_blocks.index_select(0, pp.block_ids).view(-1, num_kv_heads, head_dim)
            kb, vb = kb[: pp.seq_len], vb[: pp.seq_len]
            if scales is not None:
                kb = dequantize_kv(kb, scales.k_scale, query.dtype)
                vb = dequantize_kv(vb, scales.v_scale, query.dtype)
            k = kb.transpose(0, 1).unsqueeze(0)  # [1, Hkv, S, D]
            v = vb.transpose(0, 1).unsqueeze(0)
            q = query[pp.start : pp.end].transpose(0, 1).unsqueeze(0)  # [1, Hq, Lq, D]
            o = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=pp.mask,
                is_causal=pp.mask is None,
                scale=scale,
                enable_gqa=num_kv_heads != num_heads,
            )
            out[pp.start : pp.end] = o[0].transpose(0, 1)
        return out

    def _scratch(self, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reusable gather buffers [rows, block_numel] (fresh multi-MB buffers cost page faults)."""
        kbuf = self._kbuf
        if (
            kbuf is None
            or kbuf.shape[0] < rows
            or kbuf.shape[1] != like.shape[1]
            or (kbuf.dtype != like.dtype or kbuf.device != like.device)
        ):
            self._kbuf = kbuf = like.new_empty(rows, like.shape[1])
            self._vbuf = like.new_empty(rows, like.shape[1])
        assert self._vbuf is not None
        return kbuf[:rows], self._vbuf[:rows]

    def _decode(
        self, query: torch.Tensor, kv_cache: torch.Tensor, dp: _DecodePlan, scale: float
    ) -> torch.Tensor:
        """query [n, Hq, D] (one token per sequence) -> [n, Hq, D]: the C++ kernel on CPU when
        it is switched on, builds and takes these inputs (never an fp8 cache); else the torch
        path."""
        fp8 = is_fp8_kv(kv_cache)
        if USE_CPU_DECODE_KERNEL and query.device.type == "cpu" and not fp8:
            out = paged_decode_attention(
                query, kv_cache[0], kv_cache[1], dp.kernel_tables, dp.kernel_seq_lens, scale
            )
            if out is not None:
                return out
        num_blocks_total = kv_cache.shape[1]
        return self._decode_torch(
            query,
            kv_cache[0].view(num_blocks_total, -1),
            kv_cache[1].view(num_blocks_total, -1),
            dp,
            kv_cache.shape[3],
            scale,
            kv_scales_of(kv_cache) if fp8 else None,
        )

    def _decode_torch(
        self,
        query: torch.Tensor,
        k_blocks: torch.Tensor,
        v_blocks: torch.Tensor,
        dp: _DecodePlan,
        num_kv_heads: int,
        scale: float,
        kv_scales: KVCacheScales | None = None,
    ) -> torch.Tensor:
        """The reference decode: query [n, Hq, D] (one token per sequence) -> [n, Hq, D], in
        chunks of sequences whose gathered K+V fit DECODE_CHUNK_BYTES, so each chunk is still
        in cache when SDPA reads it. kv_scales: the blocks are fp8; dequantize after gathering."""
        n, num_heads, head_dim = query.shape
        block_numel = k_blocks.shape[1]
        block_size = block_numel // (num_kv_heads * head_dim)
        limit = DECODE_CHUNK_BYTES if query.device.type == "cpu" else None
        # q head h reads kv head h // group: the group is SDPA's "query length" axis
        q = query.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        if dp.order is not None:
            q = q.index_select(0, dp.order)
        out = torch.empty_like(q)
        s = 0
        while s < n:
            nb = dp.nbs[s]  # the longest context of this chunk (sequences are sorted)
            per_seq = 2 * nb * block_numel * max(k_blocks.element_size(), query.element_size())
            e = n if limit is None else min(n, s + max(1, limit // per_seq))
            kbuf, vbuf = self._scratch((e - s) * nb, k_blocks)
            ids = dp.tables[s:e, :nb].reshape(-1)
            k = torch.index_select(k_blocks, 0, ids, out=kbuf)
            v = torch.index_select(v_blocks, 0, ids, out=vbuf)
            if kv_scales is not None:
                k = dequantize_kv(k, kv_scales.k_scale, q.dtype)
                v = dequantize_kv(v, kv_scales.v_scale, q.dtype)
            ctx = nb * block_size
            out[s:e] = F.scaled_dot_product_attention(
                q[s:e],
                k.view(e - s, ctx, num_kv_heads, head_dim).transpose(1, 2),
                v.view(e - s, ctx, num_kv_heads, head_dim).transpose(1, 2),
                attn_mask=dp.mask[s:e, :, :, :ctx],
                scale=scale,
            )
            s = e
        if dp.order is not None:
            out = torch.empty_like(out).index_copy_(0, dp.order, out)
        return out.reshape(n, num_heads, head_dim)
