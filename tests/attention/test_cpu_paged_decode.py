"""The C++ CPU paged-decode kernel against its references: a float64 softmax over K/V gathered
through the block table, and the torch backend's own decode path (its reference twin).

Caches are full of random finite values (like reused blocks) and block tables are random
non-contiguous ids, so any read beyond seq_len or through a wrong block would show.
Everything skips, with the reason, when the extension cannot be built here.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernels.cpu import paged_decode as pd
from kernels.cpu.build import CpuExtension
from tests.kernels.cpu_kernels import load_or_skip
from workbench.attention import torch_backend
from workbench.attention.metadata import AttentionMetadata


@pytest.fixture(scope="module", autouse=True)
def kernel() -> object:
    return load_or_skip(pd.EXTENSION)


def make_case(
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_cols: int = 2,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """query [n, Hq, D], kv_cache [2, blocks, bs, Hkv, D], block_tables [n, W], seq_lens [n]."""
    g = torch.Generator().manual_seed(seed)
    n = len(seq_lens)
    width = max(-(-s // block_size) for s in seq_lens) + spare_cols
    num_blocks = n * width + 1 + 7  # block 0 is the null block; some blocks stay unused
    kv = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=g) * 2
    ids = torch.randperm(num_blocks - 1, generator=g)[: n * width] + 1
    tables = ids.view(n, width).clone()
    for i, s in enumerate(seq_lens):  # columns past the context: padding with the null block
        tables[i, -(-s // block_size) :] = 0
    query = torch.randn(n, num_heads, head_dim, generator=g)
    return query.to(dtype), kv.to(dtype), tables, torch.tensor(seq_lens, dtype=torch.long)


def reference(
    query: torch.Tensor,
    kv: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Float64 softmax(q k^T * scale) v per sequence, K/V gathered through the block table."""
    n, hq, d = query.shape
    _, _, bs, hkv, _ = kv.shape
    out = torch.empty(n, hq, d, dtype=torch.float64)
    for i in range(n):
        s = int(seq_lens[i])
        blocks = tables[i, : -(-s // bs)]
        k = kv[0, blocks].reshape(-1, hkv, d)[:s].double()  # [S, Hkv, D]
        v = kv[1, blocks].reshape(-1, hkv, d)[:s].double()
        k = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
        w = torch.softmax((query[i].double().unsqueeze(1) @ k.transpose(1, 2)) * scale, dim=-1)
        out[i] = (w @ v).squeeze(1)
    return out


def lens_for(block_size: int) -> list[int]:
    bs = block_size
    return [1, bs, bs + 1, 2 * bs - 1, 3 * bs, 5, 300, 37 * bs + 3]


def assert_close(got: torch.Tensor, ref: torch.Tensor, atol: float = 1e-5) -> None:
    torch.testing.assert_close(got.double(), ref, atol=atol, rtol=atol)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_matches_reference_fp32(group: int, head_dim: int, block_size: int) -> None:
    num_kv_heads = 2
    q, kv, tables, lens = make_case(
        lens_for(block_size), num_kv_heads * group, num_kv_heads, head_dim, block_size, seed=group
    )
    scale = head_dim**-0.5
    ref = reference(q, kv, tables, lens, scale)
    for split in (-1, 0, block_size, 40):
        out = pd.paged_decode_attention(q, kv[0], kv[1], tables, lens, scale, split_tokens=split)
        assert out is not None and out.dtype == torch.float32 and out.shape == q.shape
        assert_close(out, ref)


@pytest.mark.parametrize("threads", [1, 2])
def test_long_context_splits_across_threads(threads: int) -> None:
    """Few sequences, long contexts: the automatic split scheme (partials merged exactly)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for lens in ([1], [2001], [700, 1], [1000, 999, 17]):
            q, kv, tables, sl = make_case(lens, 8, 1, 64, 16, seed=len(lens))
            out = pd.paged_decode_attention(q, kv[0], kv[1], tables, sl, 0.125)
            assert out is not None
            assert_close(out, reference(q, kv, tables, sl, 0.125))
    finally:
        torch.set_num_threads(old)


def test_odd_head_dim_and_strided_inputs() -> None:
    """A head size without a specialisation; query and block-table views with row strides."""
    q, kv, tables, lens = make_case([3, 33, 64, 65], 6, 3, 40, 8, seed=3, spare_cols=5)
    wide = torch.randn(4, 9, 40)
    wide[:, 1:7] = q
    q_view = wide[:, 1:7]
    assert not q_view.is_contiguous()
    out = pd.paged_decode_attention(q_view, kv[0], kv[1], tables[:, :9], lens, 0.3)
    assert out is not None
    assert_close(out, reference(q, kv, tables, lens, 0.3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_upcasts(dtype: torch.dtype) -> None:
    q, kv, tables, lens = make_case(lens_for(16), 8, 4, 64, 16, dtype=dtype, seed=5)
    out = pd.paged_decode_attention(q, kv[0], kv[1], tables, lens, 0.125)
    assert out is not None and out.dtype == dtype
    ref = reference(q, kv, tables, lens, 0.125)
    # fp32 math on the low-precision inputs: only the output rounding (bf16 eps 2^-8) is lost
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_unsupported_inputs_fall_back() -> None:
    q, kv, tables, lens = make_case([5, 9], 4, 2, 64, 4)
    assert (
        pd.paged_decode_attention(q.double(), kv[0].double(), kv[1].double(), tables, lens, 1.0)
        is None
    )
    assert pd.paged_decode_attention(q, kv[0].half(), kv[1].half(), tables, lens, 1.0) is None
    bad = tables.clone()
    bad[0, 0] = kv.shape[1]  # a block id past the cache
    with pytest.raises(RuntimeError, match="out of range"):
        pd.paged_decode_attention(q, kv[0], kv[1], bad, lens, 1.0)
    with pytest.raises(RuntimeError, match="does not fit"):
        pd.paged_decode_attention(q, kv[0], kv[1], tables[:, :1], lens, 1.0)


def test_disabled_by_env(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pd.EXTENSION, "_state", {})
    monkeypatch.setenv("WORKBENCH_CPU_KERNELS", "0")
    assert pd.load() is None
    assert "WORKBENCH_CPU_KERNELS=0" in (pd.unavailable_reason() or "")
    assert "WORKBENCH_CPU_KERNELS=0" in caplog.text
    q, kv, tables, lens = make_case([5], 4, 2, 64, 4)
    assert pd.paged_decode_attention(q, kv[0], kv[1], tables, lens, 1.0) is None


def metadata(
    query_lens: list[int], seq_lens: list[int], tables: torch.Tensor, bs: int, num_pad: int = 0
) -> AttentionMetadata:
    slots = []
    for i, (ql, sl) in enumerate(zip(query_lens, seq_lens, strict=True)):
        for p in range(sl - ql, sl):
            slots.append(int(tables[i, p // bs]) * bs + p % bs)
    slots += [-1] * num_pad
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()]),
        seq_lens=torch.tensor(seq_lens, dtype=torch.long),
        block_tables=tables,
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=list(seq_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )


@pytest.mark.parametrize(
    ("query_lens", "num_pad"),
    [
        ([1] * 8, 0),  # pure decode, unsorted contexts
        ([1] * 8, 3),  # pure decode with padding rows
        ([1, 1, 5, 1, 1, 1, 1, 16], 0),  # decodes mixed with prefills (chunked and full)
    ],
)
def test_backend_kernel_matches_torch_path(
    monkeypatch: pytest.MonkeyPatch, query_lens: list[int], num_pad: int
) -> None:
    bs, hq, hkv, d = 16, 8, 4, 64
    seq_lens = [17, 250, 16, 1, 100, 33, 64, 16]
    q, kv, tables, _ = make_case(seq_lens, hq, hkv, d, bs, seed=11)
    num_tokens = sum(query_lens) + num_pad
    g = torch.Generator().manual_seed(1)
    query = torch.randn(num_tokens, hq, d, generator=g)
    key = torch.randn(num_tokens, hkv, d, generator=g)
    value = torch.randn(num_tokens, hkv, d, generator=g)
    outs = []
    for use_kernel in (False, True):
        monkeypatch.setattr(torch_backend, "USE_CPU_DECODE_KERNEL", use_kernel)
        cache = kv.clone()
        md = metadata(query_lens, seq_lens, tables, bs, num_pad)
        backend = torch_backend.TorchAttentionBackend()
        outs.append(backend.forward(query, key, value, cache, md, d**-0.5))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    assert outs[1][sum(query_lens) :].abs().sum() == 0  # padding rows stay zero


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def expected_lanes(flags: set[str]) -> int:
    """The fp32 vector path -march=native gives (simd_f32.h): AVX-512, AVX2 + FMA, none."""
    if "avx512f" in flags:
        return 16
    return 8 if {"avx2", "fma"} <= flags else 0


def test_native_build_takes_this_cpus_vector_path(kernel: ModuleType) -> None:
    lanes = expected_lanes(cpu_flags())
    assert kernel.simd_lanes() == lanes
    name = {16: "AVX-512", 8: "AVX2", 0: "portable"}[lanes]
    assert pd.EXTENSION.status().endswith(f"({name} fp32 path)")


@pytest.fixture(scope="module")
def avx2_kernel() -> ModuleType:
    """The same sources built with AVX-512 switched off: the vector path an AVX2-only machine
    (an AMD Zen 2/3, an older Xeon) compiles, checked here on an AVX-512 machine."""
    flags = cpu_flags()
    if "avx512f" not in flags or not {"avx2", "fma"} <= flags:
        pytest.skip("needs an AVX-512 CPU (an AVX2-only one runs this path natively above)")
    return load_or_skip(CpuExtension("paged_decode_avx2", pd.SOURCES,
                                     extra_cflags=["-mno-avx512f"]))


@pytest.mark.parametrize("head_dim", [32, 64, 128, 40])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_avx2_build_matches_reference(avx2_kernel: ModuleType, group: int, head_dim: int) -> None:
    assert avx2_kernel.simd_lanes() == 8
    q, kv, tables, lens = make_case(lens_for(16), 2 * group, 2, head_dim, 16, seed=7 + group)
    scale = head_dim**-0.5
    ref = reference(q, kv, tables, lens, scale)
    for split in (-1, 0, 16, 40):
        out = torch.empty_like(q)
        avx2_kernel.paged_decode(out, q, kv[0], kv[1], tables, lens, scale, split)
        assert_close(out, ref)
