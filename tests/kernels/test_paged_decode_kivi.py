"""The KIVI (int8 / int4 / int2) paged-decode kernels against their twins: the C++ CPU kernel
(`kernels.cpu.paged_decode.paged_decode_kivi_attention`) and the Triton kernel
(`kernels.triton.paged_decode.paged_decode_attention_kivi`, under TRITON_INTERPRET=1 on CPU).

Caches hold random codes, random positive float16 scales and random zeros; every third block
is full precision (a residual slot); block tables are shuffled non-contiguous ids whose spare
columns point at the null block. The reference is a float64 softmax over K/V dequantized with
`kernels.quant.kv_kivi` (fp32), the residual rows where a block has a slot; the torch twins
(`decode_kivi_torch`, `paged_decode_attention_kivi_ref`) must agree with it too.
Tolerances: fp32 1e-5 (absolute and relative), fp16 / bf16 queries 2e-2 (the CPU kernel
computes in fp32 on unrounded dequantized values, the twins round them to the query dtype).
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import paged_decode as pd
from kernels.quant.kv_kivi import KiviLayout, dequantize_keys, dequantize_values
from kernels.triton import INTERPRETED
from kernels.triton import paged_decode as tpd
from tests.kernels.cpu_kernels import load_or_skip
from workbench.attention.kivi_attention import decode_kivi_torch
from workbench.attention.kivi_cache import KiviLayerCache, KiviResidualMap

Case = tuple[torch.Tensor, KiviLayerCache, torch.Tensor, torch.Tensor]


def kivi_case(
    seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
    bits: int, group: int, dtype: torch.dtype = torch.float32, seed: int = 0,
    device: str = "cpu",
) -> Case:
    """query [n, Hq, D], a random KIVI cache (every third block full precision), block tables
    [n, W] (spare columns = the null block), seq_lens [n]."""
    g = torch.Generator().manual_seed(seed)
    n = len(seq_lens)
    width = max(-(-s // block_size) for s in seq_lens) + 2
    num_blocks = n * width + 8
    lay = KiviLayout(bits, block_size, num_kv_heads, head_dim, group)
    fp_blocks = list(range(2, num_blocks, 3))
    slots = len(fp_blocks) + 1
    rmap = KiviResidualMap(num_blocks, slots, block_size, 0, torch.device(device))
    for i, b in enumerate(fp_blocks):
        rmap.slot_of[b] = (i * 7) % slots if slots > 1 else 0
    rmap.slot_of_device = rmap.slot_of.to(device)
    shape_c = (num_blocks, block_size, num_kv_heads, lay.packed_dim)
    shape_v = (num_blocks, block_size, num_kv_heads, lay.num_groups)

    def codes() -> torch.Tensor:
        return torch.randint(0, 256, shape_c, generator=g, dtype=torch.uint8).to(device)

    def scales(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=g) * 0.3 / (1 << bits) + 1e-3).half().to(device)

    def zeros(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) - 0.5).half().to(device)

    cache = KiviLayerCache(
        layout=lay, k_codes=codes(), v_codes=codes(),
        k_scale=scales(num_blocks, num_kv_heads, head_dim),
        k_zero=zeros(num_blocks, num_kv_heads, head_dim),
        v_scale=scales(*shape_v), v_zero=zeros(*shape_v),
        residual=torch.randn(2, slots, block_size, num_kv_heads, head_dim, generator=g)
        .to(dtype).to(device),
        residual_map=rmap,
    )
    ids = torch.randperm(num_blocks - 1, generator=g)[: n * width] + 1
    tables = ids.view(n, width).clone()
    for i, s in enumerate(seq_lens):
        tables[i, -(-s // block_size) :] = 0
    query = torch.randn(n, num_heads, head_dim, generator=g).to(dtype)
    return (query.to(device), cache, tables.to(device),
            torch.tensor(seq_lens, dtype=torch.long, device=device))


def dense_kv(cache: KiviLayerCache) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole cache dequantized in fp32 [num_blocks, bs, Hkv, D], residual rows overlaid."""
    bits = cache.layout.bits
    k = dequantize_keys(cache.k_codes, cache.k_scale, cache.k_zero, bits)
    v = dequantize_values(cache.v_codes, cache.v_scale, cache.v_zero, bits)
    slot_of = cache.residual_map.slot_of_device
    fp = slot_of >= 0
    k[fp] = cache.residual[0][slot_of[fp]].float()
    v[fp] = cache.residual[1][slot_of[fp]].float()
    return k, v


def reference(query: torch.Tensor, cache: KiviLayerCache, tables: torch.Tensor,
              seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Float64 softmax(q k^T * scale) v over the dequantized context; zeros for seq_len 0."""
    k_all, v_all = dense_kv(cache)
    n, hq, d = query.shape
    hkv, bs = cache.layout.num_kv_heads, cache.layout.block_size
    out = torch.zeros(n, hq, d, dtype=torch.float64)
    for i in range(n):
        s = int(seq_lens[i])
        if s == 0:
            continue
        blocks = tables[i, : -(-s // bs)].cpu()
        k = k_all.cpu()[blocks].reshape(-1, hkv, d)[:s].double()
        v = v_all.cpu()[blocks].reshape(-1, hkv, d)[:s].double()
        k = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        v = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        w = torch.softmax((query[i].cpu().double().unsqueeze(1) @ k.transpose(1, 2)) * scale,
                          dim=-1)
        out[i] = (w @ v).squeeze(1)
    return out


def close(got: torch.Tensor, ref: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(got.cpu().double(), ref, atol=tol, rtol=tol)


def cpu_kernel(case: Case, scale: float, split: int = -1) -> torch.Tensor | None:
    q, c, tables, lens = case
    return pd.paged_decode_kivi_attention(
        q, c.k_codes, c.v_codes, c.k_scale, c.k_zero, c.v_scale, c.v_zero, c.residual[0],
        c.residual[1], c.residual_map.slot_of_device, tables, lens, scale, c.layout.bits,
        split_tokens=split)


# ----------------------------------------------------------------------------- C++ (CPU)
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize(("block_size", "head_dim", "group", "gqa"),
                         [(4, 16, 16, 1), (16, 64, 16, 4), (16, 32, 32, 2)])
def test_cpu_kernel_matches_reference_and_twin(
    bits: int, block_size: int, head_dim: int, group: int, gqa: int
) -> None:
    load_or_skip(pd.EXTENSION)
    lens = [1, block_size, block_size + 1, 3 * block_size, 5, 150]
    case = kivi_case(lens, 2 * gqa, 2, head_dim, block_size, bits, group, seed=bits + gqa)
    scale = head_dim**-0.5
    ref = reference(*case, scale)
    close(decode_kivi_torch(*case, scale), ref)
    for split in (-1, 0, block_size, 40):
        out = cpu_kernel(case, scale, split)
        assert out is not None and out.dtype == torch.float32 and out.shape == case[0].shape
        close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_kernel_low_precision_queries(dtype: torch.dtype) -> None:
    load_or_skip(pd.EXTENSION)
    case = kivi_case([3, 17, 64, 100], 8, 2, 32, 16, 4, 16, dtype=dtype, seed=9)
    out = cpu_kernel(case, 0.2)
    assert out is not None and out.dtype == dtype
    ref = reference(*case, 0.2)
    close(out, ref, 2e-2)
    close(decode_kivi_torch(*case, 0.2), ref, 2e-2)


def test_cpu_kernel_declines_what_it_cannot_take() -> None:
    q, c, tables, lens = kivi_case([5], 4, 2, 16, 4, 4, 16)
    half = c.residual.half()  # the residual must be in the query dtype
    assert pd.paged_decode_kivi_attention(
        q, c.k_codes, c.v_codes, c.k_scale, c.k_zero, c.v_scale, c.v_zero, half[0], half[1],
        c.residual_map.slot_of_device, tables, lens, 0.5, 4) is None


# ----------------------------------------------------------------------------- Triton
DEVICE = "cpu" if INTERPRETED else "cuda"


def triton_kernel(case: Case, scale: float, num_splits: int | None = None) -> torch.Tensor:
    q, c, tables, lens = case
    return tpd.paged_decode_attention_kivi(
        q, c.k_codes, c.v_codes, c.k_scale, c.k_zero, c.v_scale, c.v_zero, c.residual[0],
        c.residual[1], c.residual_map.slot_of_device, tables, lens, scale, c.layout.bits,
        num_splits=num_splits)


@pytest.mark.parametrize(("bits", "block_size", "head_dim", "group", "gqa", "dtype"), [
    (8, 16, 32, 32, 1, torch.float32),
    (4, 16, 16, 8, 4, torch.float32),
    (2, 32, 32, 16, 2, torch.float32),
    (4, 16, 32, 32, 2, torch.float16),
])
def test_triton_kernel_matches_its_twin(
    bits: int, block_size: int, head_dim: int, group: int, gqa: int, dtype: torch.dtype
) -> None:
    lens = [0, 1, block_size + 3, 70]  # a padding row (seq_len 0) first
    case = kivi_case(lens, 2 * gqa, 2, head_dim, block_size, bits, group, dtype=dtype,
                     seed=bits, device=DEVICE)
    scale = head_dim**-0.5
    twin = tpd.paged_decode_attention_kivi_ref(
        case[0], case[1].k_codes, case[1].v_codes, case[1].k_scale, case[1].k_zero,
        case[1].v_scale, case[1].v_zero, case[1].residual[0], case[1].residual[1],
        case[1].residual_map.slot_of_device, case[2], case[3], scale, bits)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    for splits in (1, 3):
        out = triton_kernel(case, scale, splits)
        assert out.dtype == dtype
        close(out, twin.cpu().double(), tol)
    if dtype == torch.float32:
        close(twin, reference(*case, scale))
    assert (triton_kernel(case, scale)[0] == 0).all()


COMPILE_SCRIPT = """
import os
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton import paged_decode as pd

fn = pd._paged_decode_kivi_split_kernel
types = {"q_ptr": "*bf16", "kc_ptr": "*u8", "vc_ptr": "*u8", "ks_ptr": "*fp16",
         "kz_ptr": "*fp16", "vs_ptr": "*fp16", "vz_ptr": "*fp16", "rk_ptr": "*bf16",
         "rv_ptr": "*bf16", "slot_ptr": "*i64", "block_tables_ptr": "*i64",
         "seq_lens_ptr": "*i64", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32",
         "scale": "fp32"}
for bits in (8, 4, 2):
    consts = dict(GROUP=4, GROUP_PAD=16, HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_SIZE=16,
                  TILE_N=pd.TILE, NUM_SPLITS=8, BITS=bits, V_GROUP=32, DOT_FP32=False)
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    kernel = triton.compile(ASTSource(fn, sig, constexprs=consts),
                            target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], bits
print("compiled")
"""


def test_triton_kernel_compiles_for_sm90() -> None:
    """The interpreter does not run Triton's compiler: compile the bf16 variants (each bit
    width) to an sm_90 cubin (no GPU needed) so type and shape rules are checked."""
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
