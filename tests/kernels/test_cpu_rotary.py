"""The C++ CPU rotary kernel: bitwise equal to RotaryEmbedding's torch ops, in place."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import rotary as kr
from tests.kernels.cpu_kernels import load_or_skip
from workbench.layers.rotary import RotaryEmbedding


@pytest.fixture(scope="module", autouse=True)
def kernel() -> object:
    return load_or_skip(kr.EXTENSION)


def _qkv(tokens: int, hq: int, hk: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, generator=g) * 3
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)  # strided views, as the model has
    return qkv, q, k, v


@pytest.mark.parametrize(("hq", "hk", "d"), [(8, 4, 64), (4, 4, 128), (2, 1, 32), (6, 2, 16)])
@pytest.mark.parametrize("scaling", [None, {"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_kernel_equals_the_torch_ops_bitwise(hq: int, hk: int, d: int, scaling: dict | None,
                                             tokens: int) -> None:
    rope = RotaryEmbedding(d, 2048, 10000.0, scaling)
    positions = torch.randint(0, 2048, (tokens,), generator=torch.Generator().manual_seed(d))
    qkv, q, k, v = _qkv(tokens, hq, hk, d, seed=tokens + d)
    want_q, want_k = rope.forward_native(positions, q, k)
    v_before = v.clone()
    got_q, got_k = rope(positions, q, k)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()  # in place
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)  # bitwise
    assert torch.equal(v, v_before)  # the V part of the row is not touched
    assert qkv.data_ptr() == q.data_ptr()


def test_a_deliberate_fma_would_be_caught() -> None:
    """The bitwise test above can fail: one fused multiply-add per element changes bits."""
    rope = RotaryEmbedding(64, 512, 10000.0)
    positions = torch.arange(200)
    _, q, k, _ = _qkv(200, 4, 2, 64, seed=1)
    want_q, _ = rope.forward_native(positions, q, k)
    cos = rope.cos_cache[positions].double().unsqueeze(1)
    sin = rope.sin_cache[positions].double().unsqueeze(1)
    q3 = q.reshape(200, 4, 64).double()
    x1, x2 = q3.chunk(2, dim=-1)
    fused = (q3 * cos + torch.cat((-x2, x1), dim=-1) * sin).float().reshape(200, -1)
    assert not torch.equal(fused, want_q)  # a single rounding differs from torch's three


def test_declines_what_it_does_not_take() -> None:
    rope = RotaryEmbedding(64, 128, 10000.0)
    _, q, k, _ = _qkv(3, 2, 2, 64, seed=0)
    for args in [
        (torch.tensor([0, 1, 128]), q, k),  # a position past the table: torch raises
        (torch.tensor([0, 1, 2], dtype=torch.int32), q, k),
        (torch.arange(3), q.to(torch.bfloat16), k.to(torch.bfloat16)),
        (torch.arange(3), q[:, :100], k),  # not whole heads
    ]:
        before = (args[1].clone(), args[2].clone())
        assert not kr.rotary_neox_(*args, rope.cos_cache, rope.sin_cache, 64)
        assert torch.equal(args[1], before[0]) and torch.equal(args[2], before[1])
    with pytest.raises(IndexError):
        rope(torch.tensor([0, 1, 128]), q, k)
