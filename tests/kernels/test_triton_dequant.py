"""The W8A16 / W4A16 Triton dequant-matmuls against their plain-PyTorch twins.

On a CPU machine the kernels run under TRITON_INTERPRET=1 on CPU tensors (importing
`kernels.triton` sets it); with CUDA the same tests run on the GPU. Shapes are odd on purpose
(M = 1, 3, 17; N = 48, 80 are not multiples of the 64-wide N tile), and both int4 tilings run:
K tiles inside one group (group_size a multiple of BLOCK_K) and K tiles straddling groups.
Data are unit scale (x ~ N(0, 1), W ~ N(0, 1/K), bias ~ N(0, 1)) so outputs are O(1):
fp32 must agree within 1e-4 of max |y|, fp16 within 1e-2 absolute. The exactness tests use
identity activations so y = W'.T, with W' built from a formula of (row, column, group).
"""

from __future__ import annotations

import types

import pytest
import torch

from kernels.triton import INTERPRETED
from kernels.triton import dequant_matmul as dq
from workbench.layers.linear import ReplicatedLinear
from workbench.layers.quantization import int4, int8

DEVICE = "cpu" if INTERPRETED else "cuda"
MS = (1, 3, 17)
NS = (48, 80)
INT4_KG = [(64, 32), (64, 64), (256, 32), (256, 64), (256, 128)]  # (K, group_size)


def _case(
    m: int, n: int, k: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [m, k] in dtype, w [n, k] fp32, bias [n] in dtype; unit-scale outputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k**0.5
    bias = torch.randn(n, generator=g)
    return x.to(DEVICE, dtype), w, bias.to(DEVICE, dtype)


def _assert_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert y.shape == ref.shape and y.dtype == ref.dtype and y.device == ref.device
    err = (y.float() - ref.float()).abs().max().item()
    if y.dtype == torch.float32:
        bound = 1e-4 * ref.abs().max().item()
    else:
        bound = 1e-2
    assert err <= bound, f"max |kernel - twin| = {err:.3g} > {bound:.3g}"


# ---------------------------------------------------------------- kernel vs twin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("k", [64, 100, 256])  # 100: a partial last K tile
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", MS)
def test_w8a16_matches_twin(m: int, n: int, k: int, with_bias: bool, dtype: torch.dtype) -> None:
    x, w, bias = _case(m, n, k, dtype)
    q, scale = (t.to(DEVICE) for t in int8.quantize(w))
    b = bias if with_bias else None
    _assert_close(dq.w8a16_matmul(x, q, scale, b), dq.w8a16_matmul_torch(x, q, scale, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize(("k", "group_size"), INT4_KG)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", MS)
def test_w4a16_matches_twin(
    m: int, n: int, k: int, group_size: int, with_bias: bool, dtype: torch.dtype
) -> None:
    x, w, bias = _case(m, n, k, dtype)
    qw, scales, zeros = (t.to(DEVICE) for t in int4.quantize(w, group_size))
    b = bias if with_bias else None
    _assert_close(
        dq.w4a16_matmul(x, qw, scales, zeros, group_size, b),
        dq.w4a16_matmul_torch(x, qw, scales, zeros, group_size, b),
    )


@pytest.mark.parametrize(
    ("k", "group_size", "block_k"),
    [(64, 32, 64), (128, 16, 64), (72, 8, None), (96, 24, None), (64, 2, None)],
    ids=["g32-in-k64", "g16-in-k64", "g8-partial-tile", "g24", "g2"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_w4a16_tiles_straddling_groups_match_twin(
    k: int, group_size: int, block_k: int | None, dtype: torch.dtype
) -> None:
    """Group sizes smaller than, or not dividing, the K tile take the per-column group path."""
    x, w, bias = _case(17, 80, k, dtype, seed=1)
    qw, scales, zeros = (t.to(DEVICE) for t in int4.quantize(w, group_size))
    y = dq.w4a16_matmul(x, qw, scales, zeros, group_size, bias, block_k=block_k)
    _assert_close(y, dq.w4a16_matmul_torch(x, qw, scales, zeros, group_size, bias))


def test_leading_dims_strided_input_and_empty_batch() -> None:
    x, w, bias = _case(6, 48, 128, torch.float32)
    wide = torch.randn(6, 256, device=DEVICE)[:, 64:192]  # rows 256 apart: a strided view
    q, scale = (t.to(DEVICE) for t in int8.quantize(w))
    qw, scales, zeros = (t.to(DEVICE) for t in int4.quantize(w, 32))
    for xs in (x.reshape(2, 3, 128), wide):
        _assert_close(
            dq.w8a16_matmul(xs, q, scale, bias), dq.w8a16_matmul_torch(xs, q, scale, bias)
        )
        _assert_close(
            dq.w4a16_matmul(xs, qw, scales, zeros, 32, bias),
            dq.w4a16_matmul_torch(xs, qw, scales, zeros, 32, bias),
        )
    assert dq.w8a16_matmul(x[:0], q, scale).shape == (0, 48)
    assert dq.w4a16_matmul(x[:0], qw, scales, zeros, 32).shape == (0, 48)


# ---------------------------------------------------------------- exact layouts


def test_w8a16_exact_on_a_weight_encoding_row_and_column() -> None:
    """q[n, k] = (n + k) % 255 - 127 is unique per column of a row, scale[n] = n + 1: with
    identity activations y = W'.T exactly, so any transposed or shifted read shows."""
    n, k = 48, 128
    rows, cols = torch.arange(n)[:, None], torch.arange(k)[None, :]
    q = ((rows + cols) % 255 - 127).to(torch.int8)
    scale = (torch.arange(n) + 1).float()
    expected = (q.float() * scale[:, None]).T
    assert torch.equal(int8.dequantize(q, scale).T, expected)  # the construction is the format
    y = dq.w8a16_matmul(torch.eye(k, device=DEVICE), q.to(DEVICE), scale.to(DEVICE))
    assert torch.equal(y.cpu(), expected)


@pytest.mark.parametrize(
    ("group_size", "block_k"), [(64, None), (32, None), (32, 64), (8, None)],
    ids=["aligned-g64", "aligned-g32", "straddle-g32-k64", "straddle-g8"],
)
def test_w4a16_exact_on_a_weight_encoding_row_column_and_group(
    group_size: int, block_k: int | None
) -> None:
    """W'[n, k] = q + 16 * (n * num_groups + k // G) with q = (n + k) % 16: the value names its
    row, group and (through q, which differs between neighbours) nibble. A swapped nibble
    order, a wrong group index or a wrong row shows as an inexact entry."""
    n, k = 48, 128
    num_groups = k // group_size
    rows, cols = torch.arange(n)[:, None], torch.arange(k)[None, :]
    q = ((rows + cols) % 16).to(torch.uint8)
    group_ids = rows * num_groups + torch.arange(num_groups)[None, :]
    scales, zeros = torch.ones(n, num_groups), (16 * group_ids).float()
    expected = (q.float() + 16 * (rows * num_groups + cols // group_size)).T
    qweight = int4.pack(q)
    assert torch.equal(int4.dequantize(qweight, scales, zeros).T, expected)
    y = dq.w4a16_matmul(
        torch.eye(k, device=DEVICE), qweight.to(DEVICE), scales.to(DEVICE), zeros.to(DEVICE),
        group_size, block_k=block_k,
    )  # fmt: skip
    assert torch.equal(y.cpu(), expected)


# ---------------------------------------------------------------- argument checks


def test_bad_arguments_raise_value_error() -> None:
    x, w, _ = _case(2, 48, 64, torch.float32)
    q, scale = (t.to(DEVICE) for t in int8.quantize(w))
    qw, scales, zeros = (t.to(DEVICE) for t in int4.quantize(w, 32))
    with pytest.raises(ValueError, match=r"x has 32 input features but qweight \[N, K\] has K"):
        dq.w8a16_matmul(x[:, :32], q, scale)
    with pytest.raises(ValueError, match=r"scale must have shape \(48,\)"):
        dq.w8a16_matmul(x, q, scale[:47])
    with pytest.raises(ValueError, match=r"x dtype \(torch.float64\) is not supported"):
        dq.w8a16_matmul(x.double(), q, scale)
    with pytest.raises(ValueError, match=r"scales must have shape \(48, 1\)"):
        dq.w4a16_matmul(x, qw, scales, zeros, 64)
    with pytest.raises(ValueError, match=r"in_features \(64\) is not divisible by group_size"):
        dq.w4a16_matmul(x, qw, scales, zeros, 48)
    with pytest.raises(ValueError, match=r"block_k \(24\) must be a power of two >= 16"):
        dq.w4a16_matmul(x, qw, scales, zeros, 32, block_k=24)
    with pytest.raises(ValueError, match=r"bias must have shape \(48,\)"):
        dq.w4a16_matmul(x, qw, scales, zeros, 32, torch.zeros(80, device=DEVICE))


# ---------------------------------------------------------------- routing from the quant methods


@pytest.mark.parametrize("module", [int8, int4], ids=["int8", "int4"])
def test_use_triton_routes_cuda_inputs_unless_forced(
    module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def on(dtype: torch.dtype) -> types.SimpleNamespace:  # stands in for a CUDA tensor
        return types.SimpleNamespace(is_cuda=True, dtype=dtype)

    assert module.use_triton(on(torch.bfloat16)) and module.use_triton(on(torch.float32))
    assert not module.use_triton(on(torch.float64))  # the kernel does not take it
    assert not module.use_triton(torch.zeros(2))  # CPU: the torch reference
    monkeypatch.setattr(module, "FORCE_TORCH", True)
    assert not module.use_triton(on(torch.float16))


@pytest.mark.parametrize(
    ("method", "kernel_name"),
    [(int8.Int8Method(), "w8a16_matmul"), (int4.Int4Method(group_size=32), "w4a16_matmul")],
    ids=["int8", "int4"],
)
def test_apply_runs_the_kernel_when_routed(
    method: int8.Int8Method | int4.Int4Method, kernel_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply() with use_triton forced on (as on CUDA) calls the Triton launcher, whose output
    matches the same layer's torch path; forced off, the kernel is not called."""
    module = int8 if isinstance(method, int8.Int8Method) else int4
    layer = ReplicatedLinear(64, 80, bias=True)
    layer.weight_loader(layer.weight, torch.randn(80, 64) / 8)
    layer.weight_loader(layer.bias, torch.randn(80))
    method.quantize_layer(layer)
    layer.quant_method = method
    layer.to(DEVICE)
    x = torch.randn(2, 3, 64, device=DEVICE)

    calls: list[tuple[int, ...]] = []
    launcher = getattr(dq, kernel_name)

    def spy(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return launcher(x, *args, **kwargs)

    monkeypatch.setattr(dq, kernel_name, spy)
    monkeypatch.setattr(module, "FORCE_TORCH", True)
    y_torch = layer(x)
    assert calls == []
    monkeypatch.setattr(module, "FORCE_TORCH", False)
    monkeypatch.setattr(module, "use_triton", lambda x: True)
    y_kernel = layer(x)
    assert calls == [(2, 3, 64)]
    _assert_close(y_kernel, y_torch)
