"""Kernel-vs-twin cases and the timed decode-attention call for `workbench.bench.gpu_check`.

Each case builds random inputs on the device, runs the Triton kernel and its plain-PyTorch
twin on the same inputs, and returns both outputs; the check records the max abs error against
the case's bound (bf16 outputs round to ~3 significant digits, hence bounds of a few 1e-2 on
unit-scale data; fp32 on CPU is tight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.attention.metadata import FP8_KV_DTYPE


@dataclass
class KernelCase:
    kernel: str
    name: str
    bound: float
    run: Callable[[], tuple[torch.Tensor, torch.Tensor]]


def _paged(
    device: str, dtype: torch.dtype, seq_lens: list[int], hkv: int, d: int, bs: int,
    fp8: bool = False, seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random paged K/V cache with shuffled block ids: (k_cache, v_cache, tables, lens)."""
    g = torch.Generator().manual_seed(seed)
    nbs = [-(-n // bs) for n in seq_lens]
    total = sum(nbs) + 1
    perm = (torch.randperm(total - 1, generator=g) + 1).tolist()
    width = max(nbs)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int64)
    i = 0
    for r, nb in enumerate(nbs):
        tables[r, :nb] = torch.tensor(perm[i:i + nb])
        i += nb
    k = torch.randn(total, bs, hkv, d, generator=g)
    v = torch.randn(total, bs, hkv, d, generator=g)
    store = FP8_KV_DTYPE if fp8 else dtype
    return (k.to(store).to(device), v.to(store).to(device), tables.to(device),
            torch.tensor(seq_lens, dtype=torch.int64, device=device))


def kernel_cases(device: str, dtype: torch.dtype, quick: bool = False) -> list[KernelCase]:
    from kernels.triton import dequant_matmul as dq
    from kernels.triton import paged_decode as pd
    from kernels.triton import paged_prefill as pp
    from kernels.triton import reshape_and_cache as rc
    from workbench.layers.quantization import int4, int8

    tight = dtype == torch.float32
    attn_bound = 1e-4 if tight else 2e-2
    cases: list[KernelCase] = []
    d = 32 if quick else 128
    lens = [5, 40, 17] if quick else [1, 1000, 4099, 333]
    one = torch.ones(1, dtype=torch.float32, device=device)

    for hq, hkv, bs in ((4, 4, 16), (8, 2, 32)) if quick else ((32, 32, 16), (32, 8, 16),
                                                                (14, 2, 16), (64, 8, 32)):
        for fp8 in (False, True):
            def decode(hq: int = hq, hkv: int = hkv, bs: int = bs, fp8: bool = fp8
                       ) -> tuple[torch.Tensor, torch.Tensor]:
                kc, vc, tables, sl = _paged(device, dtype, lens, hkv, d, bs, fp8)
                q = torch.randn(len(lens), hq, d, device=device).to(dtype)
                kv_scale = one if fp8 else None
                got = pd.paged_decode_attention(q, kc, vc, tables, sl, d**-0.5,
                                                k_scale=kv_scale, v_scale=kv_scale)
                want = pd.paged_decode_attention_ref(q, kc, vc, tables, sl, d**-0.5,
                                                     k_scale=kv_scale, v_scale=kv_scale)
                return got, want

            tag = f"Hq{hq}/Hkv{hkv} bs{bs}{' fp8' if fp8 else ''}"
            cases.append(KernelCase("paged_decode", tag, attn_bound, decode))

            def prefill(hq: int = hq, hkv: int = hkv, bs: int = bs, fp8: bool = fp8
                        ) -> tuple[torch.Tensor, torch.Tensor]:
                kc, vc, tables, sl = _paged(device, dtype, lens, hkv, d, bs, fp8)
                # query lengths: a decode row, a prefix hit and fresh prefills
                qlens = [1, min(13, lens[1])] + [n for n in lens[2:]]
                qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()],
                                   dtype=torch.int64, device=device)
                q = torch.randn(sum(qlens), hq, d, device=device).to(dtype)
                kw = {"k_scale": one, "v_scale": one} if fp8 else {}
                got = pp.paged_prefill_attention(q, kc, vc, tables, sl, qsl, max(qlens),
                                                 d**-0.5, **kw)
                want = pp.paged_prefill_attention_ref(q, kc, vc, tables, sl, qsl, d**-0.5, **kw)
                return got, want

            cases.append(KernelCase("paged_prefill", tag, attn_bound, prefill))

    for fp8 in (False, True):
        def cache(fp8: bool = fp8) -> tuple[torch.Tensor, torch.Tensor]:
            nb, bs, hkv = 9, 16, 2
            store = FP8_KV_DTYPE if fp8 else dtype
            kc = torch.zeros(nb, bs, hkv, d, device=device).to(store)
            vc, kc2, vc2 = kc.clone(), kc.clone(), kc.clone()
            n = 20
            key = torch.randn(n, hkv, d, device=device).to(dtype)
            val = torch.randn(n, hkv, d, device=device).to(dtype)
            slots = torch.randperm(nb * bs - bs, device=device)[:n] + bs
            slots[3] = -1
            kw = {"k_scale": one, "v_scale": one} if fp8 else {}
            rc.reshape_and_cache(key, val, kc, vc, slots, **kw)
            rc.reshape_and_cache_ref(key, val, kc2, vc2, slots, **kw)
            return torch.cat([kc.float(), vc.float()]), torch.cat([kc2.float(), vc2.float()])

        cases.append(KernelCase("reshape_and_cache", "fp8" if fp8 else str(dtype), 0.0, cache))

    mm_bound = 1e-3 if tight else 3e-2
    shapes = [(3, 64, 128)] if quick else [(1, 896, 4864), (16, 4864, 896), (64, 4096, 4096)]
    for m, n, k in shapes:
        def w8(m: int = m, n: int = n, k: int = k) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(m, k, device=device).to(dtype)
            q, s = int8.quantize(torch.randn(n, k, device=device) / k**0.5)
            return dq.w8a16_matmul(x, q, s), dq.w8a16_matmul_torch(x, q, s)

        def w4(m: int = m, n: int = n, k: int = k) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(m, k, device=device).to(dtype)
            group = 64 if quick else 128
            qw, sc, z = int4.quantize(torch.randn(n, k, device=device) / k**0.5, group)
            return (dq.w4a16_matmul(x, qw, sc, z, group),
                    dq.w4a16_matmul_torch(x, qw, sc, z, group))

        cases.append(KernelCase("w8a16_matmul", f"M{m} N{n} K{k}", mm_bound, w8))
        cases.append(KernelCase("w4a16_matmul", f"M{m} N{n} K{k}", mm_bound, w4))
    return cases


def decode_attention_call(
    device: str, dtype: torch.dtype, batch: int, context: int, num_heads: int,
    num_kv_heads: int, head_dim: int, block_size: int,
) -> Callable[[], torch.Tensor]:
    """A closure running paged decode attention for `batch` sequences of `context` tokens
    (blocks shuffled across the pool, output preallocated), for timing."""
    from kernels.triton import paged_decode as pd

    nb = -(-context // block_size)
    total = batch * nb + 1
    perm = torch.randperm(total - 1, device=device) + 1
    tables = perm.view(batch, nb)
    shape = (total, block_size, num_kv_heads, head_dim)
    kc = torch.randn(shape, device=device, dtype=dtype)
    vc = torch.randn(shape, device=device, dtype=dtype)
    sl = torch.full((batch,), context, dtype=torch.int64, device=device)
    q = torch.randn(batch, num_heads, head_dim, device=device, dtype=dtype)
    out = torch.empty_like(q)
    scale = head_dim**-0.5

    def call() -> torch.Tensor:
        return pd.paged_decode_attention(q, kc, vc, tables, sl, scale, out=out)

    return call
