"""The MKL-packed CPU GEMM: equal to its twin F.linear, used exactly where it applies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from workbench.layers import cpu_gemm
from workbench.layers.cpu_gemm import PACKED_GEMM_MAX_TOKENS, linear, pack_linear_weights

needs_mkl = pytest.mark.skipif(
    cpu_gemm.unavailable_reason(torch.float32, "cpu") is not None,
    reason=str(cpu_gemm.unavailable_reason(torch.float32, "cpu")))


@needs_mkl
@pytest.mark.parametrize("rows", [1, 3, 16, 37, 64, PACKED_GEMM_MAX_TOKENS])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (512, 1408), (1408, 512)])
def test_packed_gemm_equals_f_linear(rows: int, k: int, n: int) -> None:
    g = torch.Generator().manual_seed(rows * 7 + k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 64)
    x = torch.randn(rows, 2 * k, generator=g)[:, :k]  # strided, like SiluAndMul's view
    for bias in (None, b):
        ref = F.linear(x, w, bias).double()
        got = linear(x, w, bias, packed)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        exact = (x.double() @ w.double().t()) + (0 if bias is None else bias.double())
        # the same rounding class as F.linear: both within fp32 accumulation error of exact
        bound = 4 * k * torch.finfo(torch.float32).eps * (x.abs().double() @ w.abs().double().t())
        assert ((got.double() - exact).abs() <= bound + 1e-6).all()
        assert ((ref - exact).abs() <= bound + 1e-6).all()


@needs_mkl
def test_routing_packed_only_for_2d_batches_up_to_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = torch.ops.mkl._mkl_linear

    class Spy:
        def __call__(self, x, packed, w, bias, rows):  # type: ignore[no-untyped-def]
            calls.append(rows)
            return real(x, packed, w, bias, rows)

    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", Spy())
    w = torch.randn(32, 16)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 64)
    for shape in [(1, 16), (PACKED_GEMM_MAX_TOKENS, 16), (PACKED_GEMM_MAX_TOKENS + 1, 16),
                  (0, 16), (2, 3, 16)]:
        out = linear(torch.randn(*shape), w, None, packed)
        assert out.shape == (*shape[:-1], 32)
    linear(torch.randn(4, 16), w, None, None)  # not packed: F.linear
    assert calls == [1, PACKED_GEMM_MAX_TOKENS]


def test_unavailable_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "dtype torch.bfloat16" in str(cpu_gemm.unavailable_reason(torch.bfloat16, "cpu"))
    assert "device cuda" in str(cpu_gemm.unavailable_reason(torch.float32, "cuda"))
    monkeypatch.setenv("WORKBENCH_CPU_PACKED_GEMM", "0")
    assert cpu_gemm.unavailable_reason(torch.float32, "cpu") == (
        "disabled by WORKBENCH_CPU_PACKED_GEMM=0")


@needs_mkl
def test_engine_packs_every_fp32_linear_and_the_lm_head(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench import LLM, SamplingParams
    from workbench.layers.embedding import ParallelLMHead
    from workbench.layers.linear import LinearBase
    from workbench.testing import tiny_checkpoint

    monkeypatch.setenv("WORKBENCH_CPU_LINEAR_BACKEND", "mkl")  # this test is MKL's path
    ckpt = tiny_checkpoint(tmp_path / "m", arch="qwen3", seed=3)
    kw = {"dtype": "float32", "max_model_len": 128, "num_gpu_blocks_override": 64}
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * k for k in (1, 3, 9)]
    llm = LLM(ckpt, **kw)
    model = llm.engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, (LinearBase, ParallelLMHead))]
    assert layers and all(m.packed_weight is not None and m.packed_weight.is_mkldnn
                          for m in layers)
    assert llm.memory_readout()["packed_weight_bytes"] == sum(
        m.weight.numel() * 4 for m in layers)
    packed_tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    monkeypatch.setenv("WORKBENCH_CPU_LINEAR_BACKEND", "torch")
    plain = LLM(ckpt, **kw)
    assert plain.memory_readout()["packed_weight_bytes"] == 0
    assert all(m.packed_weight is None for m in plain.engine.runner.model.modules()
               if isinstance(m, (LinearBase, ParallelLMHead)))
    assert [o.outputs[0].token_ids for o in plain.generate(prompts, greedy)] == packed_tokens
    # int8 layers are not packed (their own kernel), the LM head still is
    monkeypatch.setenv("WORKBENCH_CPU_LINEAR_BACKEND", "mkl")
    q = LLM(ckpt, **kw, quantization="int8").engine.runner.model
    assert all(m.packed_weight is None for m in q.modules() if isinstance(m, LinearBase))
    assert q.lm_head.packed_weight is not None
    # a weight changed in place after loading: repacking serves the new weight
    head = model.lm_head
    before = linear(torch.ones(1, head.weight.shape[1]), head.weight, None, head.packed_weight)
    with torch.no_grad():
        head.weight.mul_(2)
    pack_linear_weights(model)
    after = linear(torch.ones(1, head.weight.shape[1]), head.weight, None, head.packed_weight)
    torch.testing.assert_close(after, 2 * before)
