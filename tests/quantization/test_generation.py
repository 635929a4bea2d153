"""End to end: LLM(quantization=...) on a tiny random checkpoint, against the fp32 engine.

One module fixture runs every mode once: greedy generation (10 prompts x 16 tokens) and the
teacher-forced logits of prompt + fp32's output. The figures in the comments were measured on
tiny_checkpoint(arch="llama", seed=0): hidden 64, 2 layers, vocab 1024, fp32 logit std 1.64.
A random model is the hard case (no redundancy to absorb the error); the bounds sit ~1.3-1.5x
above the measured values and far below an unrelated model's (rms ~2.3).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.config import EngineConfig
from workbench.core.kv_cache.utils import cdiv
from workbench.layers.linear import LinearBase
from workbench.planning import quantized_weight_bytes
from workbench.testing import tiny_checkpoint
from workbench.worker.model_runner import ModelRunner

NUM_OUTPUT = 16
MODES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "int8": {"quantization": "int8"},
    "fp8": {"quantization": "fp8"},
    "int4": {"quantization": "int4", "quantization_group_size": 32},
}
ENGINE = {"dtype": "float32", "max_model_len": 128, "block_size": 16,
          "num_gpu_blocks_override": 64, "enable_prefix_caching": False}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("quant") / "llama", arch="llama", seed=0)


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(10, 1024) for _ in range(n)]
            for n in (3, 70, 17, 33, 9, 52, 40, 25, 12, 60)]


def _teacher_forced_logits(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """Logits at every position of one prefill through the engine's runner (no request in
    flight and prefix caching off, so borrowing blocks 1.. is harmless)."""
    runner = llm.engine.runner
    blocks = list(range(1, 1 + cdiv(len(tokens), runner.block_size)))
    ids, pos, meta = runner.build_batch(tokens, [0], [len(tokens)], [blocks])
    with torch.inference_mode():
        return runner.model.compute_logits(runner.model(ids, pos, meta))


@pytest.fixture(scope="module")
def runs(ckpt: Path) -> dict[str, dict[str, Any]]:
    prompts = _prompts()
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    out: dict[str, dict[str, Any]] = {}
    for mode, kwargs in MODES.items():
        llm = LLM(ckpt, **ENGINE, **kwargs)
        outs = llm.generate(prompts, greedy)
        tokens = [o.outputs[0].token_ids for o in outs]
        forced = out["fp32"]["tokens"] if mode != "fp32" else tokens
        logits = torch.cat([_teacher_forced_logits(llm, p + t) for p, t in zip(prompts, forced,
                                                                             strict=True)])
        out[mode] = {
            "tokens": tokens,
            "finish": [o.outputs[0].finish_reason for o in outs],
            "logits": logits,
            "weight_bytes": llm.memory_readout()["weight_bytes"],
            "params": {n: (p.dtype, tuple(p.shape))
                       for n, p in llm.engine.runner.model.named_parameters()},
            "linears": [(m.input_size, m.output_size)
                        for m in llm.engine.runner.model.modules() if isinstance(m, LinearBase)],
        }
        del llm
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_generation_runs_to_the_requested_length(runs: dict[str, Any], mode: str) -> None:
    assert [len(t) for t in runs[mode]["tokens"]] == [NUM_OUTPUT] * 10
    assert set(runs[mode]["finish"]) == {"length"}


def test_int8_greedy_mostly_agrees_with_fp32(runs: dict[str, Any]) -> None:
    ref, q = runs["fp32"], runs["int8"]
    first8 = sum(a[:8] == b[:8] for a, b in zip(ref["tokens"], q["tokens"], strict=True))
    assert first8 >= 7  # measured 8/10 (5/10 identical over all 16 tokens)
    argmax = (q["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean().item()
    assert argmax >= 0.9  # measured 0.954 of 547 teacher-forced positions


# mode -> (rms bound, max bound, argmax agreement floor); measured rms / max / argmax:
# int8 0.054 / 0.49 / 0.954, fp8 0.312 / 3.0 / 0.697, int4 (group 32) 0.683 / 5.9 / 0.472
LOGIT_BOUNDS = {"int8": (0.08, 0.8, 0.9), "fp8": (0.45, 4.5, 0.6), "int4": (0.9, 8.0, 0.38)}


@pytest.mark.parametrize("mode", list(LOGIT_BOUNDS))
def test_logits_close_to_fp32(runs: dict[str, Any], mode: str) -> None:
    ref, q = runs["fp32"]["logits"], runs[mode]["logits"]
    rms_bound, max_bound, agree_floor = LOGIT_BOUNDS[mode]
    diff = q - ref
    rms = diff.pow(2).mean().sqrt().item()
    assert 0.01 < rms < rms_bound  # not a no-op, and close
    assert diff.abs().max().item() < max_bound
    assert (q.argmax(-1) == ref.argmax(-1)).float().mean().item() >= agree_floor


def test_error_grows_as_bits_shrink(runs: dict[str, Any]) -> None:
    rms = {m: (runs[m]["logits"] - runs["fp32"]["logits"]).pow(2).mean().item()
           for m in LOGIT_BOUNDS}
    assert rms["int8"] < rms["fp8"] < rms["int4"]


def test_only_the_linear_layers_are_quantized(runs: dict[str, Any]) -> None:
    params = runs["int4"]["params"]
    linear = {n: v for n, v in params.items() if "_proj." in n}
    assert {n.rsplit(".", 1)[1] for n in linear} == {"qweight", "scales", "zeros"}
    assert params["model.layers.0.mlp.down_proj.qweight"] == (torch.uint8, (64, 64))
    assert params["model.layers.0.mlp.down_proj.scales"] == (torch.float32, (64, 4))
    rest = {v[0] for n, v in params.items() if n not in linear}
    assert rest == {torch.float32}  # embed_tokens, lm_head, norms
    for mode, dtype in (("int8", torch.int8), ("fp8", torch.float8_e4m3fn)):
        p = runs[mode]["params"]
        assert p["model.layers.1.self_attn.qkv_proj.weight"] == (dtype, (128, 64))
        assert p["model.layers.1.self_attn.qkv_proj.weight_scale"] == (torch.float32, (128,))
        assert p["lm_head.weight"] == (torch.float32, (1024, 64))


@pytest.mark.parametrize(("mode", "group_size"), [("int8", 128), ("fp8", 128), ("int4", 32),
                                                  ("int4", 64)])
def test_memory_readout_shows_the_smaller_weights(
    runs: dict[str, Any], ckpt: Path, mode: str, group_size: int
) -> None:
    linears = runs["fp32"]["linears"]
    num_params = sum(i * o for i, o in linears)
    num_rows = sum(o for _, o in linears)
    fp32_bytes = runs["fp32"]["weight_bytes"]
    rest = fp32_bytes - 4 * num_params  # embeddings, lm_head, norms, RoPE table: unchanged
    if mode == "int4" and group_size == 64:  # not run end to end above: load it here
        cfg = EngineConfig.from_kwargs(ckpt, dtype="float32", max_model_len=128,
                                       quantization="int4", quantization_group_size=64)
        readout = ModelRunner(cfg).weight_bytes
    else:
        readout = runs[mode]["weight_bytes"]
    linear_bytes = quantized_weight_bytes(num_params, num_rows, mode, group_size, dtype_bytes=4)
    assert readout == rest + linear_bytes
    ratio = linear_bytes / (4 * num_params)
    # int8/fp8: 1/4 + a scale per row; int4: 1/8 + (scale, zero) per group
    expected_ratio = {"int8": 0.264, "fp8": 0.264, "int4": 1 / 8 + 2 / group_size}
    assert ratio == pytest.approx(expected_ratio[mode], abs=0.001)
    assert fp32_bytes - readout == 4 * num_params - linear_bytes > 0
