"""The C++ CPU RMSNorm: equal to RMSNorm's torch ops up to the last bit of a row's scale."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import rms_norm as kn
from tests.kernels.cpu_kernels import load_or_skip
from workbench.layers.norm import RMSNorm


@pytest.fixture(scope="module", autouse=True)
def kernel() -> object:
    return load_or_skip(kn.EXTENSION)


def _norm(d: int, seed: int) -> RMSNorm:
    norm = RMSNorm(d, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=torch.Generator().manual_seed(seed)))
    return norm


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Each element within 2 ulp-scale steps of the twin (the scale may differ by 1 ulp,
    which moves w * (x * r) by at most ~2 float32 epsilons relative)."""
    tol = 4 * torch.finfo(torch.float32).eps * want.abs() + 1e-30
    assert ((got - want).abs() <= tol).all()


@pytest.mark.parametrize("d", [64, 512, 1000, 4096])
@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_norm_and_fused_add_equal_the_torch_ops(d: int, tokens: int) -> None:
    norm = _norm(d, d)
    g = torch.Generator().manual_seed(tokens * d)
    base = torch.randn(tokens, 2 * d, generator=g) * 4
    x = base[:, :d]  # a strided view: rows of stride 2d
    residual = torch.randn(tokens, d, generator=g)
    want = norm.forward_native(x)
    got = norm(x)
    assert got.shape == want.shape and got.data_ptr() != x.data_ptr()
    _close(got, want)
    want_out, want_res = norm.forward_native(x, residual)
    x_in, res_in = x.clone(), residual.clone()
    got_out, got_res = norm(x_in, res_in)
    assert got_out.data_ptr() == x_in.data_ptr() and got_res.data_ptr() == res_in.data_ptr()
    assert torch.equal(got_res, want_res)  # the add is one rounding either way: bitwise
    _close(got_out, want_out)


def test_most_rows_are_bitwise_equal_and_a_wrong_formula_is_caught() -> None:
    norm = _norm(512, 0)
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(1))
    got, want = norm(x), norm.forward_native(x)
    same_rows = (got == want).all(dim=1).float().mean().item()
    assert same_rows > 0.5  # mostly identical; the rest differ in the last bit of the scale
    wrong = norm.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))  # eps 1e-6
    with pytest.raises(AssertionError):
        _close(wrong, want)


def test_declines_what_it_does_not_take() -> None:
    norm = _norm(64, 0)
    x = torch.randn(3, 64)
    assert kn.rms_norm(x.to(torch.float64), norm.weight.double(), 1e-5) is None
    assert kn.rms_norm(x.reshape(3, 2, 32), norm.weight[:32], 1e-5) is None
    assert kn.rms_norm(x[:, ::2], norm.weight[:32], 1e-5) is None  # columns not contiguous
    assert not kn.fused_add_rms_norm_(x, x, norm.weight, 1e-5)  # aliasing
    r = torch.randn(3, 64)
    before = (x.clone(), r.clone())
    assert not kn.fused_add_rms_norm_(x, r[:2], norm.weight, 1e-5)
    assert torch.equal(x, before[0]) and torch.equal(r, before[1])
    # the module falls back to the torch ops for what the kernel declines (3-D rows)
    x3 = torch.randn(2, 3, 64)
    assert torch.equal(norm(x3), norm.forward_native(x3))
