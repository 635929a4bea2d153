"""KIVI low-bit KV (kv_cache_dtype int8 / int4 / int2): the formats (pack / unpack, directed
float16 rounding, per-channel keys and per-token values, their round-trip error bound and exact
round trips on grid values), the residual map's state after each batch (which block sits in
which slot, what was quantized, eviction, release, copy-on-write), and attention over the
cache equal to attention over the dequantized cache (the torch twin and the C++ kernel).
"""

from __future__ import annotations

import pytest
import torch

from kernels.quant.kv_kivi import (
    KiviLayout,
    dequantize_keys,
    dequantize_values,
    half_toward,
    pack,
    quantize_keys,
    quantize_values,
    unpack,
)
from tests.kv_cache.test_fp8_kv import _metadata
from workbench.attention import torch_backend
from workbench.attention.kivi_attention import decode_kivi_torch, forward_kivi
from workbench.attention.kivi_cache import (
    KiviLayerCache,
    KiviResidualMap,
    allocate_kivi_caches,
    gather_kivi,
    get_kivi,
)
from workbench.attention.torch_backend import TorchAttentionBackend
from workbench.core.kv_cache.utils import kivi_bytes_per_block

BITS = [8, 4, 2]


# ----------------------------------------------------------------------------- formats
def test_pack_worked_examples_and_round_trip() -> None:
    q4 = torch.tensor([3, 10, 0, 15, 1, 2], dtype=torch.uint8)
    assert pack(q4, 4).tolist() == [0xA3, 0xF0, 0x21]
    q2 = torch.tensor([1, 2, 3, 0, 3, 3, 3, 3], dtype=torch.uint8)
    assert pack(q2, 2).tolist() == [1 | 2 << 2 | 3 << 4, 255]
    g = torch.Generator().manual_seed(0)
    for bits in BITS:
        q = torch.randint(0, 1 << bits, (3, 5, 32), generator=g, dtype=torch.uint8)
        p = pack(q, bits)
        assert p.shape == (3, 5, 32 * bits // 8)
        assert torch.equal(unpack(p, bits), q)


def test_half_toward_rounds_down_and_up() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(4000, generator=g) * 10, torch.randn(1000, generator=g) * 1e-6,
                   torch.tensor([0.0, 1.0, -2.5, 65504.0, -0.1])])
    down, up = half_toward(x, down=True), half_toward(x, down=False)
    assert down.dtype == up.dtype == torch.float16
    assert (down.float() <= x).all() and (up.float() >= x).all()
    # at most one float16 ulp apart (2^-10 relative; 2^-24 among subnormals)
    assert ((up.float() - down.float()) <= x.abs() * 2.0**-10 + 2.0**-24).all()
    exact = x.half().float() == x
    assert exact.sum() >= 4  # 0, 1, -2.5, 65504
    assert torch.equal(down.float()[exact], x[exact]) and torch.equal(up.float()[exact], x[exact])


@pytest.mark.parametrize("bits", BITS)
def test_round_trip_error_is_at_most_half_a_step(bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    k = torch.randn(3, 16, 2, 32, generator=g) * 4 + torch.randn(1, 1, 1, 32, generator=g) * 20
    codes, scale, zero = quantize_keys(k, bits)
    assert codes.dtype == torch.uint8 and codes.shape == (3, 16, 2, 32 * bits // 8)
    assert scale.shape == zero.shape == (3, 2, 32) and scale.dtype == torch.float16
    back = dequantize_keys(codes, scale, zero, bits)
    s, z = scale.float()[:, None], zero.float()[:, None]
    top = z + ((1 << bits) - 1) * s
    assert (z <= k).all() and (top >= k - 1e-6 * k.abs()).all()  # the range covers x
    assert ((back - k).abs() <= s * (0.5 + 1e-4) + 1e-6 * k.abs()).all()
    v = torch.randn(5, 2, 32, generator=g) * 3
    for group in (32, 8):
        codes, scale, zero = quantize_values(v, bits, group)
        assert scale.shape == (5, 2, 32 // group)
        back = dequantize_values(codes, scale, zero, bits)
        s = scale.float().repeat_interleave(group, dim=-1)
        assert ((back - v).abs() <= s * (0.5 + 1e-4) + 1e-6 * v.abs()).all()
    if bits == 8:  # 255 steps: about 1% of the range, not a no-op
        assert 0 < (back - v).abs().max() < 0.01 * (v.max() - v.min())


@pytest.mark.parametrize("bits", BITS)
def test_grid_values_round_trip_exactly(bits: int) -> None:
    """x = zero + q * scale with float16-exact scales (powers of two) and zeros, each group
    holding both extremes (q = 0 and 2^bits - 1): the codes and x come back exactly."""
    levels = (1 << bits) - 1
    t = torch.arange(16)
    q = torch.stack([(t * levels + 7) // 15 for _ in range(8)], dim=1)  # [16, 8]: 0..levels
    q = torch.stack([q.roll(c, dims=0)[:, c] for c in range(8)], dim=1)  # per-channel orders
    scale = 2.0 ** -(torch.arange(8) + 1.0)
    zero = -torch.arange(8) - 0.5
    k = (zero + q * scale).view(1, 16, 1, 8)
    codes, s, z = quantize_keys(k, bits)
    assert torch.equal(unpack(codes, bits).view(16, 8).long(), q)
    assert torch.equal(s.float().view(8), scale) and torch.equal(z.float().view(8), zero)
    assert torch.equal(dequantize_keys(codes, s, z, bits), k)
    # values: per token, groups of 4 channels on a common grid holding 0 and levels
    qv = torch.stack([torch.zeros(16), torch.full((16,), levels), t % (levels + 1),
                      torch.full((16,), levels // 2)], dim=1).long()  # [16, 4]
    row_scale = (2.0 ** -(t % 4 + 1.0))[:, None]
    row_zero = (t - 7.5)[:, None]
    v = (row_zero + qv * row_scale).view(16, 1, 4)
    codes, s, z = quantize_values(v, bits, 4)
    assert torch.equal(unpack(codes, bits).view(16, 4).long(), qv)
    assert torch.equal(s.float().view(16, 1), row_scale)
    assert torch.equal(dequantize_values(codes, s, z, bits), v)
    # a constant group: scale 0, every code 0, the value itself (float16-exact)
    c = torch.full((1, 16, 1, 8), -3.25)
    codes, s, z = quantize_keys(c, bits)
    assert (s == 0).all() and (codes == 0).all()
    assert torch.equal(dequantize_keys(codes, s, z, bits), c)


def test_layout_bytes_match_the_engine_arithmetic() -> None:
    for bits in BITS:
        for g in (16, 4):
            lay = KiviLayout(bits, 16, 2, 16, g)
            assert 2 * lay.block_bytes() == kivi_bytes_per_block(2, 2, 16, bits, 16, g)
    # tiny llama (head_dim 16, 2 KV heads, block 16), int4, one value group per token
    lay = KiviLayout(4, 16, 2, 16, 16)
    assert (lay.code_bytes(), lay.key_meta_bytes(), lay.value_meta_bytes()) == (512, 128, 128)
    assert lay.block_bytes() == 768
    with pytest.raises(ValueError, match="kv_quant_group_size"):
        KiviLayout(4, 16, 2, 16, 5)
    with pytest.raises(ValueError, match="bits"):
        KiviLayout(3, 16, 2, 16, 16)


# ----------------------------------------------------------------------------- the residual map
BS, HKV, D = 4, 2, 8


def _cache(num_blocks: int = 12, slots: int = 6, r: int = 4, bits: int = 4,
           dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, KiviLayerCache]:
    handles, _ = allocate_kivi_caches(1, num_blocks, KiviLayout(bits, BS, HKV, D, D), slots, r,
                                      dtype, torch.device("cpu"))
    cache = get_kivi(handles[0])
    assert cache is not None and handles[0].shape == (2, num_blocks, BS, HKV, D)
    return handles[0], cache


def _write(handle: torch.Tensor, starts: list[int], q_lens: list[int],
           tables: list[list[int]], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch through forward_kivi (torch twin); returns its new K and V rows."""
    md = _metadata(starts, q_lens, tables, BS)
    g = torch.Generator().manual_seed(seed)
    n = md.num_tokens
    k, v = torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g)
    forward_kivi(torch.randn(n, 2 * HKV, D, generator=g), k, v, handle, md, 0.3)
    return k, v


def _slots(cache: KiviLayerCache, blocks: list[int]) -> list[int]:
    return [int(cache.residual_map.slot_of[b]) for b in blocks]


def test_blocks_leave_the_window_and_are_quantized_from_their_slots() -> None:
    handle, cache = _cache(r=4)
    rmap = cache.residual_map
    k, v = _write(handle, [0], [10], [[3, 5, 7]], seed=0)  # positions 0..9, R = 4
    # block 3 (0-3): (0+1)*4 <= 10-4: quantized at once, never held a slot; 5 and 7 fp
    assert _slots(cache, [3, 5, 7]) == [-1, 0, 1] and rmap.slots_in_use == 2
    codes, scale, zero = quantize_keys(k[0:4].view(1, BS, HKV, D), 4)
    assert torch.equal(cache.k_codes[3], codes[0]) and torch.equal(cache.k_scale[3], scale[0])
    vc, vs, vz = quantize_values(v[0:4], 4, D)
    assert torch.equal(cache.v_codes[3], vc) and torch.equal(cache.v_zero[3], vz)
    gk, gv = gather_kivi(cache, torch.tensor([3, 5, 7]), torch.float32)
    assert torch.equal(gk[0], dequantize_keys(codes, scale, zero, 4)[0])
    assert torch.equal(gk[1], k[4:8]) and torch.equal(gv[2, :2], v[8:10])  # exact: fp slots
    rows_4_to_9 = k[4:10]
    k10, _ = _write(handle, [10], [1], [[3, 5, 7]], seed=1)  # L = 11: nothing leaves
    assert _slots(cache, [3, 5, 7]) == [-1, 0, 1]
    _write(handle, [11], [1], [[3, 5, 7]], seed=2)  # L = 12: block 5 (4-7) leaves, slot 0 freed
    assert _slots(cache, [3, 5, 7]) == [-1, -1, 1] and rmap.slots_in_use == 1
    codes, scale, _ = quantize_keys(rows_4_to_9[:4].view(1, BS, HKV, D), 4)
    assert torch.equal(cache.k_codes[5], codes[0]) and torch.equal(cache.k_scale[5], scale[0])
    _write(handle, [12], [1], [[3, 5, 7, 9]], seed=3)  # L = 13: block 9 opens, takes slot 0
    assert _slots(cache, [3, 5, 7, 9]) == [-1, -1, 1, 0]
    gk, _ = gather_kivi(cache, torch.tensor([7]), torch.float32)
    assert torch.equal(gk[0, :2], rows_4_to_9[4:6]) and torch.equal(gk[0, 2], k10[0])
    assert rmap.forced_quantizations == 0


def test_r_zero_quantizes_every_full_block_and_a_long_prefill_needs_no_slots() -> None:
    handle, cache = _cache(slots=1, r=0)
    _write(handle, [0], [18], [[1, 2, 3, 4, 5]], seed=0)  # 4 full blocks and 2 rows
    assert _slots(cache, [1, 2, 3, 4, 5]) == [-1, -1, -1, -1, 0]


def test_a_full_pool_quantizes_the_least_recently_written_full_block() -> None:
    handle, cache = _cache(slots=2, r=4)
    rmap = cache.residual_map
    ka, _ = _write(handle, [0], [8], [[1, 2]], seed=0)  # block 1 quantized, block 2 full fp
    _write(handle, [0], [3], [[3]], seed=1)  # block 3: partial, slot 1
    assert _slots(cache, [1, 2, 3]) == [-1, 0, 1]
    _write(handle, [0], [2], [[4]], seed=2)  # no free slot: block 2 is quantized early
    assert _slots(cache, [2, 3, 4]) == [-1, 1, 0] and rmap.forced_quantizations == 1
    codes, _, _ = quantize_keys(ka[4:8].view(1, BS, HKV, D), 4)
    assert torch.equal(cache.k_codes[2], codes[0])
    with pytest.raises(RuntimeError, match="still being filled"):
        _write(handle, [0], [1], [[6]], seed=3)  # only partial blocks hold slots


def test_released_blocks_are_quantized_or_dropped_at_the_next_batch() -> None:
    handle, cache = _cache(r=8)
    ka, _ = _write(handle, [0], [6], [[1, 2]], seed=0)  # R = 8: both blocks fp
    assert _slots(cache, [1, 2]) == [0, 1]
    cache.residual_map.release_blocks([1, 2])  # the request finished
    assert _slots(cache, [1, 2]) == [0, 1]  # nothing happens before the next batch
    _write(handle, [0], [2], [[5]], seed=1)  # another request's batch
    assert _slots(cache, [1, 2, 5]) == [-1, -1, 0]
    codes, _, _ = quantize_keys(ka[0:4].view(1, BS, HKV, D), 4)  # full block 1: quantized
    assert torch.equal(cache.k_codes[1], codes[0])
    assert cache.residual_map.slots_in_use == 1  # the partial block 2 was dropped


def test_copy_blocks_gives_a_full_precision_block_its_own_slot() -> None:
    handles, rmap = allocate_kivi_caches(2, 8, KiviLayout(4, BS, HKV, D, D), 4, 8,
                                         torch.float32, torch.device("cpu"))
    _write(handles[0], [0], [6], [[1, 2]], seed=0)
    _write(handles[1], [0], [6], [[1, 2]], seed=0)  # the same batch object is not reused
    rmap.copy_blocks([(2, 6), (1, 7)])
    layers = [get_kivi(h) for h in handles]
    for layer in layers:
        assert layer is not None
        a, b = gather_kivi(layer, torch.tensor([[2, 1], [6, 7]]), torch.float32)
        assert torch.equal(a[0], a[1]) and torch.equal(b[0], b[1])
    assert int(rmap.slot_of[6]) >= 0 and int(rmap.slot_of[6]) != int(rmap.slot_of[2])


# ----------------------------------------------------------------------------- attention
def _dequantized_cache(cache: KiviLayerCache, num_blocks: int) -> torch.Tensor:
    k, v = gather_kivi(cache, torch.arange(num_blocks), torch.float32)
    return torch.stack([k, v])  # [2, num_blocks, bs, Hkv, D]


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("cpu_kernel", [False, True])
def test_attention_equals_attention_on_the_dequantized_cache(
    bits: int, cpu_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed batch (two decodes, a prefill chunk after cached tokens, a padding row) over a
    cache with quantized and full-precision blocks: the output equals the model-dtype backend
    on a cache holding the dequantized contents (within 1e-5: the same SDPA, another
    summation order in the C++ kernel)."""
    monkeypatch.setattr(torch_backend, "USE_CPU_DECODE_KERNEL", cpu_kernel)
    handle, cache = _cache(num_blocks=14, slots=8, r=4, bits=bits)
    tables = [[7, 2, 9, 12], [4, 11, 1, 8], [10, 3, 6]]
    _write(handle, [0, 0, 0], [13, 14, 6], tables, seed=5)  # earlier context
    md = _metadata([13, 14, 6], [1, 1, 5], tables, BS, pad=2)
    g = torch.Generator().manual_seed(6)
    n = md.num_tokens
    q = torch.randn(n, 2 * HKV, D, generator=g)
    k, v = torch.randn(n, HKV, D, generator=g), torch.randn(n, HKV, D, generator=g)
    out = TorchAttentionBackend().forward(q, k, v, handle, md, 0.3)
    deq = _dequantized_cache(cache, 14)  # after the write: what attention must have read
    monkeypatch.setattr(torch_backend, "USE_CPU_DECODE_KERNEL", False)
    slots = md.slot_mapping[: n - 2]
    kd = deq[0].view(-1, HKV, D)[slots]
    vd = deq[1].view(-1, HKV, D)[slots]
    pad = torch.zeros(2, HKV, D)
    ref = TorchAttentionBackend().forward(q, torch.cat([kd, pad]), torch.cat([vd, pad]),
                                          deq.clone(), md, 0.3)
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)
    assert (out[n - 2 :] == 0).all()
    assert (cache.residual_map.slot_of[torch.tensor([7, 2, 4, 11])] == -1).all()  # quantized


def test_decode_twin_handles_an_empty_sequence() -> None:
    _, cache = _cache()
    out = decode_kivi_torch(torch.ones(2, 2 * HKV, D), cache, torch.tensor([[1], [2]]),
                            torch.tensor([0, 3]), 0.5)
    assert (out[0] == 0).all() and out[1].isfinite().all()


def test_residual_map_rejects_an_empty_pool() -> None:
    with pytest.raises(ValueError, match="num_slots"):
        KiviResidualMap(4, 0, 4, 0, torch.device("cpu"))


def test_the_triton_backend_reads_the_same_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The triton backend over a KIVI cache (decodes: the Triton kernel, under the interpreter
    on CPU; prefills: the torch twin) equals the torch backend's twin within 1e-5."""
    from workbench.attention.triton_backend import TritonAttentionBackend

    monkeypatch.setattr(torch_backend, "USE_CPU_DECODE_KERNEL", False)
    tables = [[7, 2, 9], [4, 11, 1]]
    outs = []
    for backend in (TorchAttentionBackend(), TritonAttentionBackend()):
        handle, _ = _cache(num_blocks=14, slots=8, r=4, bits=4)
        _write(handle, [0, 0], [9, 6], tables, seed=7)
        md = _metadata([9, 6], [1, 1], tables, BS)
        g = torch.Generator().manual_seed(8)
        q = torch.randn(2, 2 * HKV, D, generator=g)
        k, v = torch.randn(2, HKV, D, generator=g), torch.randn(2, HKV, D, generator=g)
        outs.append(backend.forward(q, k, v, handle, md, 0.3))
    assert torch.allclose(outs[0], outs[1], atol=1e-5, rtol=0)
