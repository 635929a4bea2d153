"""The Triton paged-attention kernels against their plain-PyTorch twins, and the twins against an
independent reference (float64 dense softmax attention on the un-paged K/V of each sequence).

The kernels run under Triton's interpreter on CPU, so the grids are small (few sequences and
heads, head_dim 16/32, short contexts) but every case is there: block sizes 16 and 32, contexts
that are not multiples of the block size, GQA ratios 1/4/8, block tables wider than needed with
shuffled non-contiguous block ids (the spare columns point at garbage blocks), a padding row
with seq_len 0, padding slots -1, 1 vs several splits, a prefix hit, a mixed decode + prefill
batch, fp32, fp16 and an fp8 cache.
"""

from __future__ import annotations

import pytest
import torch

from kernels.triton.paged_decode import (
    MAX_SPLITS,
    choose_num_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from kernels.triton.paged_prefill import paged_prefill_attention, paged_prefill_attention_ref
from kernels.triton.reshape_and_cache import (
    FP8_DTYPE,
    quantize_fp8_ref,
    reshape_and_cache,
    reshape_and_cache_ref,
)
from workbench.attention.torch_backend import quantize_kv

NUM_KV_HEADS = 2
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3}
# (block_size, GQA group, dtype, head_dim): every block size, group and dtype appears
CASES = [
    (16, 1, torch.float32, 32),
    (32, 4, torch.float32, 16),
    (16, 8, torch.float16, 16),
    (32, 1, torch.float16, 32),
]


# ---------------------------------------------------------------------------- fixtures of data
def paged(
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    block_size: int,
    gen: torch.Generator,
    spare_cols: int = 2,
    cache_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scatter each sequence's K/V rows [S_i, Hkv, D] into a paged cache whose unused slots hold
    random finite garbage; block tables of shuffled ids, `spare_cols` wider than the longest
    context, the spare columns pointing at garbage blocks (a read past seq_len would show)."""
    n = len(keys)
    hkv, d = keys[0].shape[1:]
    dtype = cache_dtype or keys[0].dtype
    width = max(-(-k.shape[0] // block_size) for k in keys) + spare_cols
    num_blocks = n * width + 1 + 5
    cache = (torch.randn(2, num_blocks, block_size, hkv, d, generator=gen) * 3).to(dtype)
    tables = (torch.randperm(num_blocks - 1, generator=gen)[: n * width] + 1).view(n, width)
    raw = cache.view(torch.uint8) if dtype == FP8_DTYPE else cache  # CPU: no fp8 index_put_
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        pos = torch.arange(k.shape[0])
        blocks, offsets = tables[i, pos // block_size], pos % block_size
        for j, rows in enumerate((k, v)):
            raw[j, blocks, offsets] = rows.view(torch.uint8) if dtype == FP8_DTYPE else rows
    return cache[0], cache[1], tables


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> torch.Tensor:
    """float64 softmax attention of q [L, Hq, D] over un-paged k/v [S, Hkv, D], query j at
    position S - L + j seeing positions 0..that."""
    length, hq, _ = q.shape
    s = k.shape[0]
    k = k.double().repeat_interleave(hq // k.shape[1], dim=1)
    v = v.double().repeat_interleave(hq // v.shape[1], dim=1)
    scores = torch.einsum("lhd,shd->hls", q.double(), k) * scale
    q_pos = torch.arange(s - length, s)[:, None]
    scores = scores.masked_fill(torch.arange(s)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hls,shd->lhd", torch.softmax(scores, dim=-1), v)


def random_kv(
    lens: list[int], d: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    keys = [torch.randn(s, NUM_KV_HEADS, d, generator=gen).to(dtype) for s in lens]
    values = [torch.randn(s, NUM_KV_HEADS, d, generator=gen).to(dtype) for s in lens]
    return keys, values


def assert_close(got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape
    assert torch.isfinite(got).all()
    err = (got.double() - want.double()).abs().max().item()
    assert err <= atol, f"max abs error {err:.3g} > {atol:.3g}"


# ---------------------------------------------------------------------------- reshape_and_cache
@pytest.mark.parametrize("block_size,dtype", [(16, torch.float32), (32, torch.float16)])
def test_reshape_and_cache_matches_twin(block_size: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, hkv, d = 6, 3, 16
    cache = (torch.randn(2, num_blocks, block_size, hkv, d, generator=gen) * 3).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:7]
    slots[[2, 5]] = -1  # padding tokens
    wide = torch.randn(7, 2 * hkv + 1, d, generator=gen).to(dtype)
    key, value = wide[:, :hkv], wide[:, hkv : 2 * hkv]  # strided views, like the layer's
    got, want = cache.clone(), cache.clone()
    reshape_and_cache(key, value, got[0], got[1], slots)
    reshape_and_cache_ref(key, value, want[0], want[1], slots)
    assert torch.equal(got, want)
    # the twin, checked directly: valid rows landed at their slot, nothing else changed
    expect = cache.clone().view(2, -1, hkv, d)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expect[0, slot], expect[1, slot] = key[t], value[t]
    assert torch.equal(want.view(2, -1, hkv, d), expect)


@pytest.mark.parametrize("k_scale,v_scale", [(0.5, 2.0), (0.037, 0.011)])
def test_reshape_and_cache_fp8_bytes(k_scale: float, v_scale: float) -> None:
    """Round to nearest even (ties exact with power-of-two scales), subnormals, saturation
    past 448 * scale, signed zeros: the kernel's bytes equal the twin's, the twin's equal
    torch_backend.quantize_kv's, and the padded slot keeps its old bytes."""
    gen = torch.Generator().manual_seed(1)
    hkv, d, block_size = 4, 64, 16
    n = 9
    x = torch.randn(n, hkv, d, generator=gen) * torch.exp(torch.randn(n, hkv, d, generator=gen) * 3)
    ties = (torch.arange(64, dtype=torch.float32) + 0.5) / 8  # halfway between e4m3 values
    x[0, 0] = ties * k_scale
    x[1, 0] = torch.linspace(-0.03, 0.03, 64) * k_scale  # the subnormal range
    x[1, 1] = torch.linspace(-600, 600, 64) * k_scale  # past the range: saturates at +-448
    x[1, 2, :2] = torch.tensor([0.0, -0.0])
    cache = torch.randint(0, 255, (2, 4, block_size, hkv, d), generator=gen, dtype=torch.uint8)
    cache[cache == 0x7F] = 0  # no NaN bytes (0x7f / 0xff) in the old contents
    cache[cache == 0xFF] = 0
    cache = cache.view(FP8_DTYPE)
    slots = torch.tensor([3, 17, 40, -1, 63, 0, 21, 50, 33])
    got, want = cache.clone(), cache.clone()
    ks, vs = torch.tensor([k_scale]), torch.tensor([v_scale])
    reshape_and_cache(x, -x, got[0], got[1], slots, ks, vs)
    reshape_and_cache_ref(x, -x, want[0], want[1], slots, ks, vs)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(quantize_fp8_ref(x, k_scale).view(torch.uint8),
                       quantize_kv(x, k_scale).view(torch.uint8))  # fmt: skip
    flat = want.view(2, -1, hkv, d)
    valid = slots >= 0
    assert torch.equal(
        flat[0, slots[valid]].view(torch.uint8), quantize_kv(x[valid], k_scale).view(torch.uint8)
    )
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots[valid]] = False
    old = cache.view(2, -1, hkv, d)
    assert torch.equal(flat[:, untouched].view(torch.uint8), old[:, untouched].view(torch.uint8))
    # dequantized values are within half an e4m3 step of x (3 mantissa bits), clamped at 448
    back = flat[0, slots[valid]].float() * k_scale
    clamped = x[valid].clamp(-448 * k_scale, 448 * k_scale)
    assert ((back - clamped).abs() <= clamped.abs() / 16 + 2**-10 * k_scale).all()
    assert flat[0, 17, 2, :2].view(torch.uint8).tolist() == [0x00, 0x80]  # +0.0, -0.0


def test_reshape_and_cache_fp8_needs_scales() -> None:
    cache = torch.zeros(2, 2, 16, 1, 16, dtype=FP8_DTYPE)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        reshape_and_cache(torch.ones(1, 1, 16), torch.ones(1, 1, 16), cache[0], cache[1],
                          torch.tensor([3]))  # fmt: skip


# ---------------------------------------------------------------------------- decode
def decode_case(
    block_size: int, group: int, dtype: torch.dtype, d: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """Sequences of mixed lengths (none a multiple of the block size except one, one padding
    row with seq_len 0) -> query, key_cache, value_cache, tables, seq_lens, dense reference."""
    gen = torch.Generator().manual_seed(seed)
    bs = block_size
    lens = [bs + 1, 0, 1, 3 * bs - 5, 2 * bs, 70]
    keys, values = random_kv(lens, d, dtype, gen)
    kc, vc, tables = paged(keys, values, block_size, gen)
    query = torch.randn(len(lens), NUM_KV_HEADS * group, d, generator=gen).to(dtype)
    scale = d**-0.5
    dense = torch.zeros(query.shape, dtype=torch.float64)
    for i, s in enumerate(lens):
        if s:
            dense[i] = dense_attention(query[i : i + 1], keys[i], values[i], scale)[0]
    return query, kc, vc, tables, torch.tensor(lens), dense


@pytest.mark.parametrize("block_size,group,dtype,head_dim", CASES)
def test_decode_matches_twin_and_reference(
    block_size: int, group: int, dtype: torch.dtype, head_dim: int
) -> None:
    q, kc, vc, tables, lens, dense = decode_case(block_size, group, dtype, head_dim, seed=group)
    scale = head_dim**-0.5
    twin = paged_decode_attention_ref(q, kc, vc, tables, lens, scale)
    assert_close(twin, dense, ATOL[dtype])
    out = paged_decode_attention(q, kc, vc, tables, lens, scale)  # num_splits chosen
    assert out.dtype == dtype
    assert_close(out, twin, ATOL[dtype])
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # seq_len 0: zeros, never NaN


def test_decode_split_counts_agree() -> None:
    """1 split and several (some empty for the short sequences: lse -inf, merged away) give
    the same result; a strided query view works."""
    q, kc, vc, tables, lens, dense = decode_case(16, 4, torch.float32, 16, seed=7)
    wide = torch.randn(q.shape[0], q.shape[1] + 3, q.shape[2])
    wide[:, 2 : 2 + q.shape[1]] = q
    q_view = wide[:, 2 : 2 + q.shape[1]]
    outs = [paged_decode_attention(q_view, kc, vc, tables, lens, 0.25, num_splits=s)
            for s in (1, 3, 8)]  # fmt: skip
    for out in outs[1:]:
        assert_close(out, outs[0], 1e-6)
    assert_close(outs[0], dense, 1e-5)
    assert torch.equal(outs[2][1], torch.zeros_like(outs[2][1]))


def test_decode_fp8_cache() -> None:
    gen = torch.Generator().manual_seed(3)
    lens, d, ks, vs = [21, 0, 40], 32, 0.01, 0.02
    keys, values = random_kv(lens, d, torch.float32, gen)
    k8 = [quantize_fp8_ref(k, ks) for k in keys]
    v8 = [quantize_fp8_ref(v, vs) for v in values]
    kc, vc, tables = paged(k8, v8, 16, gen, cache_dtype=FP8_DTYPE)
    q = torch.randn(len(lens), NUM_KV_HEADS * 4, d, generator=gen)
    seq_lens = torch.tensor(lens)
    twin = paged_decode_attention_ref(q, kc, vc, tables, seq_lens, 0.2, ks, vs)
    for i, s in enumerate(lens):  # reference: dense attention on the dequantized rows
        want = (dense_attention(q[i : i + 1], k8[i].float() * ks, v8[i].float() * vs, 0.2)
                if s else torch.zeros(1, *q.shape[1:]))  # fmt: skip
        assert_close(twin[i : i + 1], want, 1e-5)
    out = paged_decode_attention(
        q, kc, vc, tables, seq_lens, 0.2, torch.tensor([ks]), torch.tensor([vs]), num_splits=2
    )
    assert_close(out, twin, 1e-5)


def test_choose_num_splits_depends_on_shapes_only() -> None:
    cpu = torch.device("cpu")
    # one sequence, long table: several splits; wide batches: one; narrow table: capped
    assert 1 < choose_num_splits(1, 1, 64, 16, cpu) <= MAX_SPLITS
    assert choose_num_splits(64, 8, 64, 16, cpu) == 1
    assert choose_num_splits(1, 1, 1, 16, cpu) == 1
    assert all(choose_num_splits(n, 2, w, 16, cpu) >= choose_num_splits(2 * n, 2, w, 16, cpu)
               for n in (1, 2, 4) for w in (4, 32))  # fmt: skip


# ---------------------------------------------------------------------------- prefill
def prefill_case(
    block_size: int, group: int, dtype: torch.dtype, d: int, seed: int
) -> tuple[torch.Tensor, ...]:
    """A mixed batch: a fresh prefill, a prefix hit (context longer than its query), a decode
    row, a later chunk of a chunked prefill, then 3 padding rows."""
    gen = torch.Generator().manual_seed(seed)
    bs = block_size
    seqs = [(19, 19), (bs + 13, 11), (bs + 2, 1), (2 * bs + 3, bs - 2)]  # (seq_len, query_len)
    keys, values = random_kv([s for s, _ in seqs], d, dtype, gen)
    kc, vc, tables = paged(keys, values, block_size, gen, spare_cols=1)
    num_tokens = sum(ql for _, ql in seqs) + 3
    query = torch.randn(num_tokens, NUM_KV_HEADS * group, d, generator=gen).to(dtype)
    starts = [0]
    for _, ql in seqs:
        starts.append(starts[-1] + ql)
    dense = torch.zeros(query.shape, dtype=torch.float64)
    for i in range(len(seqs)):
        a, b = starts[i], starts[i + 1]
        dense[a:b] = dense_attention(query[a:b], keys[i], values[i], d**-0.5)
    return (query, kc, vc, tables, torch.tensor([s for s, _ in seqs]), torch.tensor(starts),
            max(ql for _, ql in seqs), dense)  # fmt: skip


@pytest.mark.parametrize("block_size,group,dtype,head_dim", CASES)
def test_prefill_matches_twin_and_reference(
    block_size: int, group: int, dtype: torch.dtype, head_dim: int
) -> None:
    q, kc, vc, tables, lens, qsl, max_q, dense = prefill_case(
        block_size, group, dtype, head_dim, seed=10 + group
    )
    scale = head_dim**-0.5
    twin = paged_prefill_attention_ref(q, kc, vc, tables, lens, qsl, scale)
    assert_close(twin, dense, ATOL[dtype])
    out = paged_prefill_attention(q, kc, vc, tables, lens, qsl, max_q, scale)
    assert out.dtype == dtype
    assert_close(out, twin, ATOL[dtype])
    assert torch.equal(out[-3:], torch.zeros_like(out[-3:]))  # padding rows


def test_prefill_fp8_cache() -> None:
    gen = torch.Generator().manual_seed(5)
    ks, vs, d = 0.013, 0.009, 16
    seqs = [(30, 30), (45, 7), (9, 1)]
    keys, values = random_kv([s for s, _ in seqs], d, torch.float32, gen)
    k8 = [quantize_fp8_ref(k, ks) for k in keys]
    v8 = [quantize_fp8_ref(v, vs) for v in values]
    kc, vc, tables = paged(k8, v8, 32, gen, cache_dtype=FP8_DTYPE)
    q = torch.randn(38, NUM_KV_HEADS * 8, d, generator=gen)
    qsl, lens = torch.tensor([0, 30, 37, 38]), torch.tensor([s for s, _ in seqs])
    twin = paged_prefill_attention_ref(q, kc, vc, tables, lens, qsl, 0.25, ks, vs)
    for i, (a, b) in enumerate(zip(qsl[:-1].tolist(), qsl[1:].tolist(), strict=True)):
        want = dense_attention(q[a:b], k8[i].float() * ks, v8[i].float() * vs, 0.25)
        assert_close(twin[a:b], want, 1e-5)
    out = paged_prefill_attention(
        q, kc, vc, tables, lens, qsl, 30, 0.25, torch.tensor([ks]), torch.tensor([vs])
    )
    assert_close(out, twin, 1e-5)


def test_bad_shapes_raise() -> None:
    q = torch.zeros(2, 3, 16)  # 3 query heads over 2 KV heads
    cache = torch.zeros(4, 16, 2, 16)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(q, cache, cache, torch.zeros(2, 1, dtype=torch.long),
                               torch.ones(2, dtype=torch.long), 1.0)  # fmt: skip


# ---------------------------------------------------------------------------- compiled mode
COMPILE_SCRIPT = """
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton import paged_decode as pd, paged_prefill as pp, reshape_and_cache as rc

types = {"q_ptr": "*bf16", "out_ptr": "*bf16", "key_ptr": "*bf16", "value_ptr": "*bf16",
         "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "key_cache_ptr": "*fp8e4nv",
         "value_cache_ptr": "*fp8e4nv", "block_tables_ptr": "*i64", "seq_lens_ptr": "*i64",
         "query_start_loc_ptr": "*i64", "slot_mapping_ptr": "*i64", "k_scale_ptr": "*fp32",
         "v_scale_ptr": "*fp32", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32", "scale": "fp32"}
common = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_SIZE=16)
for fn, consts in [
    (pd._paged_decode_split_kernel, dict(GROUP=4, GROUP_PAD=16, TILE_N=pd.TILE, NUM_SPLITS=8,
                                         IS_FP8=True, DOT_FP32=False, **common)),
    (pd._merge_splits_kernel, dict(NUM_SPLITS=8, SPLITS_PAD=8, HEAD_DIM=128, HEAD_DIM_PAD=128)),
    (pp._paged_prefill_kernel, dict(GROUP=4, GROUP_PAD=4, BLOCK_Q=16, TILE_N=pd.TILE,
                                    IS_FP8=True, DOT_FP32=False, **common)),
    (rc._reshape_and_cache_kernel, dict(NUM_KV_HEADS=8, HEADS_PAD=8, IS_FP8=True, **common)),
]:
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], fn.__name__
print("compiled")
"""


def test_kernels_compile_for_sm90() -> None:
    """The interpreter runs Python, not Triton's compiler: compile the fp8/bf16 variants down to
    an sm_90 cubin (Triton's bundled ptxas; no GPU needed) so type and shape rules are checked."""
    import subprocess
    import sys
    from pathlib import Path

    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Triton's NVIDIA backend is not installed: {e}")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], cwd=root, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
