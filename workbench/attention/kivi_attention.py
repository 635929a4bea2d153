"""Attention over a KIVI low-bit KV cache (kv_cache_dtype int8 / int4 / int2), shared by the
torch and triton backends (`workbench.attention.kivi_cache` has the storage and the writes).

Per layer and batch: the write plan (built once per batch) is applied (`write_kivi`), then

    decodes  (query_len == 1): a decode kernel reading the quantized blocks in place, when
             the backend passes one and it takes the inputs (the C++ CPU kernel, the Triton
             kernel); else the torch twin `decode_kivi_torch`: gather and dequantize every
             sequence's blocks (`gather_kivi`), one SDPA with a `pos < seq_len` mask;
    prefills (query_len > 1): per sequence, gather and dequantize its blocks and run SDPA
             with a bottom-right causal mask (the torch path on every backend).

So attention equals attention on the dequantized cache (and the residual's full-precision
rows), as for fp8 KV.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.cpu.paged_decode import paged_decode_kivi_attention
from workbench.attention.kivi_cache import KiviLayerCache, gather_kivi, get_kivi, write_kivi
from workbench.attention.metadata import AttentionMetadata

# (query [n, Hq, D], cache, block_tables [n, W] int64, seq_lens [n] int64, scale) -> out or
# None when the kernel does not take these inputs
DecodeKernel = Callable[
    [torch.Tensor, KiviLayerCache, torch.Tensor, torch.Tensor, float], torch.Tensor | None
]


def is_kivi_kv(kv_cache: torch.Tensor) -> bool:
    return get_kivi(kv_cache) is not None


def decode_kivi_torch(
    query: torch.Tensor, cache: KiviLayerCache, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, max_seq_len: int | None = None,
) -> torch.Tensor:
    """The twin of the decode kernels: query [n, Hq, D] (one token per sequence) -> [n, Hq, D];
    K/V gathered through block_tables, dequantized to the query dtype, SDPA over positions
    < seq_len. A sequence with seq_len 0 gets zeros."""
    n, num_heads, head_dim = query.shape
    lay = cache.layout
    bs, hkv = lay.block_size, lay.num_kv_heads
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if n else 0
    longest = max_seq_len
    nb = max(1, -(-longest // bs))
    k, v = gather_kivi(cache, block_tables[:, :nb], query.dtype)  # [n, nb, bs, Hkv, D]
    ctx = nb * bs
    k = k.view(n, ctx, hkv, head_dim).transpose(1, 2)
    v = v.view(n, ctx, hkv, head_dim).transpose(1, 2)
    pos = torch.arange(ctx, device=query.device)
    mask = (pos[None, :] < seq_lens[:, None]).view(n, 1, 1, ctx)
    q = query.reshape(n, hkv, num_heads // hkv, head_dim)  # GQA group as the query axis
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    out = torch.where((seq_lens > 0).view(n, 1, 1, 1), out, torch.zeros_like(out))
    return out.reshape(n, num_heads, head_dim)


def prefill_kivi_torch(
    query: torch.Tensor, cache: KiviLayerCache, block_ids: torch.Tensor, seq_len: int,
    scale: float,
) -> torch.Tensor:
    """One sequence's query_len > 1 tokens [q, Hq, D], the last q of seq_len positions, over
    its dequantized context (bottom-right causal) -> [q, Hq, D]."""
    q_len, num_heads, head_dim = query.shape
    hkv = cache.layout.num_kv_heads
    k, v = gather_kivi(cache, block_ids, query.dtype)  # [nb, bs, Hkv, D]
    k = k.reshape(-1, hkv, head_dim)[:seq_len].transpose(0, 1).unsqueeze(0)
    v = v.reshape(-1, hkv, head_dim)[:seq_len].transpose(0, 1).unsqueeze(0)
    mask = None
    if seq_len != q_len:
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        mask = torch.arange(seq_len, device=query.device)[None, :] <= q_pos[:, None]
    o = F.scaled_dot_product_attention(
        query.transpose(0, 1).unsqueeze(0), k, v, attn_mask=mask, is_causal=mask is None,
        scale=scale, enable_gqa=hkv != num_heads,
    )
    return o[0].transpose(0, 1)


def forward_kivi(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
    md: AttentionMetadata, scale: float, decode_kernel: DecodeKernel | None = None,
) -> torch.Tensor:
    """One layer over a KIVI cache handle (see the module docstring) -> [T, Hq, D]; padding
    rows are zeros."""
    cache = get_kivi(kv_cache)
    assert cache is not None, "forward_kivi needs a KIVI cache handle"
    plan = cache.residual_map.write_plan(md)
    write_kivi(key, value, cache, plan)
    num_tokens = query.shape[0]
    bs = cache.layout.block_size
    out = torch.zeros_like(query)
    dec = [i for i, q in enumerate(md.query_lens_cpu) if q == 1]
    if dec:
        if len(dec) == md.num_seqs:
            rows: slice | torch.Tensor = slice(0, len(dec))
            tables, seq_lens = md.block_tables, md.seq_lens
        else:
            idx = torch.tensor(dec, dtype=torch.long, device=query.device)
            rows = torch.tensor([plan.starts[i] for i in dec], dtype=torch.long,
                                device=query.device)
            tables = md.block_tables.index_select(0, idx)
            seq_lens = md.seq_lens.index_select(0, idx)
        longest = max(md.seq_lens_cpu[i] for i in dec)
        tables = tables[:, : -(-longest // bs)]
        qd = query[rows]
        o = decode_kernel(qd, cache, tables, seq_lens, scale) if decode_kernel else None
        if o is None:
            o = decode_kivi_torch(qd, cache, tables, seq_lens, scale, longest)
        out[rows] = o
    for i, q_len in enumerate(md.query_lens_cpu):
        if q_len < 2:
            continue
        seq_len, start = md.seq_lens_cpu[i], plan.starts[i]
        block_ids = md.block_tables[i, : -(-seq_len // bs)]
        out[start : start + q_len] = prefill_kivi_torch(
            query[start : start + q_len], cache, block_ids, seq_len, scale)
    assert out.shape[0] == num_tokens
    return out


def cpu_kivi_decode(
    query: torch.Tensor, cache: KiviLayerCache, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float,
) -> torch.Tensor | None:
    """The C++ CPU kernel reading the quantized blocks in place (`kernels.cpu.paged_decode`),
    or None when it cannot run (not CPU, no compiler, WORKBENCH_CPU_KERNELS=0)."""
    if query.device.type != "cpu":
        return None
    return paged_decode_kivi_attention(
        query, cache.k_codes, cache.v_codes, cache.k_scale, cache.k_zero, cache.v_scale,
        cache.v_zero, cache.residual[0], cache.residual[1], cache.residual_map.slot_of_device,
        block_tables, seq_lens, scale, cache.layout.bits,
    )
