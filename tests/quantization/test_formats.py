"""quantize/dequantize references: round-trip bounds, the int4 byte layout, exact forwards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench.layers.linear import ReplicatedLinear, RowParallelLinear
from workbench.layers.quantization import (
    QUANT_METHODS,
    fp8,
    get_quant_method,
    int4,
    int8,
    quantize_model,
)


def _weights(out_f: int = 48, in_f: int = 128, seed: int = 0) -> torch.Tensor:
    """Gaussian rows at scales 1e-3..10, one all-zero row, one row with a 50x outlier."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * torch.logspace(-3, 1, out_f)[:, None]
    w[3] = 0.0
    w[5, 7] = 50 * w[5].abs().max()
    return w


# ---------------------------------------------------------------- int8 (W8A16)
def test_int8_round_trip_within_half_a_step_per_channel() -> None:
    w = _weights()
    q, scale = int8.quantize(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert q.abs().max() == 127 and q.min() >= -127
    assert torch.equal(scale[3], torch.tensor(1.0)) and not q[3].any()  # zero row: exact
    err = (int8.dequantize(q, scale) - w).abs().amax(dim=1)
    assert torch.all(err <= scale / 2 * (1 + 1e-5))
    assert torch.equal(q.abs().amax(dim=1)[w.abs().amax(dim=1) > 0], torch.full((47,), 127,
                                                                          dtype=torch.int8))


# ---------------------------------------------------------------- int4 (W4A16)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_round_trip_within_half_a_step_per_group(group_size: int) -> None:
    w = _weights(in_f=256)
    w[7, :group_size] = 0.25  # a constant group: exact
    w[9] = w[9].abs() + 1.0  # groups that do not straddle 0: still the full 16 levels
    qweight, scales, zeros = int4.quantize(w, group_size)
    n = 256 // group_size
    assert qweight.dtype == torch.uint8 and qweight.shape == (48, 128)
    assert scales.shape == zeros.shape == (48, n) and scales.dtype == torch.float32
    groups = w.reshape(48, n, group_size)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    err = (int4.dequantize(qweight, scales, zeros) - w).abs().reshape(48, n, group_size)
    assert torch.all(err.amax(-1) <= step / 2 * (1 + 1e-5) + 1e-7)
    assert torch.equal(int4.dequantize(qweight, scales, zeros)[7, :group_size],
                       torch.full((group_size,), 0.25))


def test_int4_smaller_groups_give_smaller_error() -> None:
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 0.2
    rel = {g: ((int4.dequantize(*int4.quantize(w, g)) - w).norm() / w.norm()).item()
           for g in (32, 64, 128)}
    assert rel[32] < rel[64] < rel[128] < 0.11  # measured 0.079, 0.090, 0.100


def test_int4_packing_layout_exact_bytes() -> None:
    # Low nibble = even column, high nibble = odd column; groups of 4 along the input dim.
    w = torch.tensor([
        [0.0, 1.5, 0.5, 7.5, -3.0, 12.0, 2.0, 5.0],  # scale 0.5 zero 0 | scale 1 zero -3
        [4.0, 4.0, 4.0, 4.0, 10.0, 9.5, 3.0, 3.5],  # constant: scale 1 zero 4 | 7/15, 3
    ])
    qweight, scales, zeros = int4.quantize(w, group_size=4)
    # row 0: q = [0, 3, 1, 15 | 0, 15, 5, 8]; row 1: q = [0, 0, 0, 0 | 15, 14, 0, 1]
    assert qweight.tolist() == [[0x30, 0xF1, 0xF0, 0x85], [0x00, 0x00, 0xEF, 0x10]]
    assert scales.tolist() == [[0.5, 1.0], [1.0, pytest.approx(7 / 15)]]
    assert zeros.tolist() == [[0.0, -3.0], [4.0, 3.0]]
    assert torch.equal(int4.dequantize(qweight, scales, zeros)[0], w[0])  # on-grid: exact
    assert int4.pack(torch.tensor([[3, 10, 0, 15, 1, 2]])).tolist() == [[0xA3, 0xF0, 0x21]]
    q = torch.randint(0, 16, (5, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(int4.unpack(int4.pack(q)), q.to(torch.uint8))


def test_int4_group_size_must_divide_in_features() -> None:
    with pytest.raises(ValueError, match=r"in_features \(48\) is not divisible by group_size "
                                         r"\(32\)"):
        int4.quantize(torch.randn(4, 48), 32)
    with pytest.raises(ValueError, match=r"group_size \(3\) must be an even integer >= 2"):
        int4.quantize(torch.randn(4, 48), 3)
    with pytest.raises(ValueError, match=r"weight must be 2-D"):
        int4.quantize(torch.randn(48), 16)


# ---------------------------------------------------------------- fp8 (W8A8)
def test_fp8_round_trip_relative_bound() -> None:
    w = _weights()
    w_q, scale = fp8.quantize(w)
    assert w_q.dtype == torch.float8_e4m3fn and w_q.element_size() == 1
    assert torch.equal(w_q.float().abs().amax(dim=1)[scale != 1], torch.full((47,), 448.0))
    err = (fp8.dequantize(w_q, scale) - w).abs()
    scaled = w.abs() / scale[:, None]
    normal = scaled >= 2.0**-6  # e4m3's smallest normal
    # 3 mantissa bits: half an ulp is 2^-4 of the value; subnormals step by 2^-9 (x scale).
    assert torch.all(err[normal] <= 2.0**-4 * w.abs()[normal] * (1 + 1e-5))
    sub = (~normal).nonzero(as_tuple=True)
    assert torch.all(err[sub] <= 2.0**-10 * scale[sub[0]] * (1 + 1e-5))
    assert normal.float().mean() > 0.9


def test_fp8_activation_scales_are_per_token() -> None:
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    x[2] *= 1000.0
    x[4] = 0.0
    x_q, x_scale = fp8.quantize_activation(x)
    assert x_scale.shape == (5, 1)
    assert torch.equal(x_scale[:, 0], torch.where(x.abs().amax(1) > 0, x.abs().amax(1) / 448, 1))
    y = fp8.quantize_activation(torch.cat([x[:2], x[3:]]))[0]  # token 2 changes no other row
    assert torch.equal(y.float(), torch.cat([x_q[:2], x_q[3:]]).float())
    assert not x_q[4].float().any()


# ---------------------------------------------------------------- layers: exact forwards
def _layer(cls: type, dtype: torch.dtype, bias: bool = True) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    layer = cls(128, 96, bias=bias)
    layer.weight.data = (torch.randn(96, 128, generator=g) * 0.2).to(dtype)
    if bias:
        layer.bias.data = torch.randn(96, generator=g).to(dtype)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("method", "opts"), [("int8", {}), ("int4", {"group_size": 32})])
def test_weight_only_forward_is_x_times_dequantized_weight(
    method: str, opts: dict[str, int], dtype: torch.dtype
) -> None:
    for cls in (ReplicatedLinear, RowParallelLinear):
        layer = _layer(cls, dtype)
        w = layer.weight.data.clone()
        holder = nn.ModuleDict({"proj": layer})
        assert list(quantize_model(holder, method, **opts)) == ["proj"]
        x = torch.randn(7, 128, generator=torch.Generator().manual_seed(1)).to(dtype)
        w_deq = layer.quant_method.dequantize_layer(layer, dtype)
        assert w_deq.dtype == dtype
        assert torch.equal(layer(x), F.linear(x, w_deq, layer.bias))
        assert torch.equal(layer(x[None])[0], layer(x))  # leading dims pass through
        # Against the unquantized layer: |y - y_ref| <= |x| @ (per-element round-trip bound).T
        wf = w.float()
        if method == "int8":
            elem = (wf.abs().amax(1) / 127 / 2)[:, None].expand_as(wf)
        else:
            groups = wf.reshape(96, -1, 32)
            elem = ((groups.amax(-1) - groups.amin(-1)) / 15 / 2).repeat_interleave(32, dim=1)
        ref = F.linear(x.float(), wf, layer.bias.float())
        bound = x.float().abs() @ elem.T
        if dtype == torch.bfloat16:  # + rounding the dequantized weight and the output to bf16
            bound += 2.0**-7 * (x.float().abs() @ wf.abs().T + ref.abs())
        err = (layer(x).float() - ref).abs()
        assert torch.all(err <= bound * (1 + 1e-5)) and err.max() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_emulation_equals_explicit_fp32_reference(dtype: torch.dtype) -> None:
    layer = _layer(ReplicatedLinear, dtype)
    w = layer.weight.data.clone()
    quantize_model(nn.ModuleDict({"proj": layer}), "fp8")
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(2)).to(dtype)
    # by hand: per-token e4m3 activations, per-channel e4m3 weights, both back to fp32
    x_scale = x.float().abs().amax(dim=1, keepdim=True) / 448.0
    x_q = (x.float() / x_scale).to(torch.float8_e4m3fn)
    w_scale = w.float().abs().amax(dim=1) / 448.0
    w_q = (w.float() / w_scale[:, None]).to(torch.float8_e4m3fn)
    assert torch.equal(layer.weight.float(), w_q.float())
    ref = (x_q.float() * x_scale) @ (w_q.float() * w_scale[:, None]).T + layer.bias.float()
    assert torch.equal(layer(x), ref.to(dtype))
    exact = F.linear(x.float(), w.float(), layer.bias.float())
    # measured 0.30 (fp32), 0.26 (bf16); worst case (2^-4 per operand) ~2^-3 |x| @ |W|.T = 2.7
    assert (layer(x).float() - exact).abs().max() < 0.5


@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)),
    reason="needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9)",
)
def test_fp8_scaled_mm_matches_emulation_on_gpu() -> None:
    layer = _layer(ReplicatedLinear, torch.bfloat16).cuda()
    quantize_model(nn.ModuleDict({"proj": layer}), "fp8")
    x = torch.randn(33, 128, device="cuda", dtype=torch.bfloat16)
    y = layer(x)
    assert layer.quant_method.use_scaled_mm, "torch._scaled_mm was refused"
    x_q, x_scale = fp8.quantize_activation(x)
    ref = fp8.scaled_mm_reference(x_q, x_scale, layer.weight, layer.weight_scale, layer.bias,
                                  torch.float32)
    assert (y.float() - ref).abs().max() <= 2e-2 * ref.abs().max()


# ---------------------------------------------------------------- registry
def test_registry_and_option_errors() -> None:
    assert set(QUANT_METHODS) == {"int8", "int4", "fp8"}
    with pytest.raises(ValueError, match=r"quantization \('int3'\) must be one of 'int8', "
                                         r"'int4', 'fp8'"):
        get_quant_method("int3")
    with pytest.raises(ValueError, match=r"quantization 'int8' takes no option\(s\) group_size"):
        get_quant_method("int8", group_size=64)


def test_bad_group_size_leaves_every_layer_untouched() -> None:
    model = nn.ModuleDict({"a": ReplicatedLinear(128, 8), "b": ReplicatedLinear(96, 8)})
    with pytest.raises(ValueError, match=r"quantization_group_size \(64\) must divide the "
                                         r"in_features of every quantized linear layer, but b "
                                         r"has in_features 96 \(1 of 2 layers do not fit\); "
                                         r"32 would fit every layer"):
        quantize_model(model, "int4", group_size=64)
    assert all(m.quant_method is None and m.weight.dtype == torch.float32
               for m in model.values())
