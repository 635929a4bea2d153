"""KV compression through `LLM` on the bundled tiny checkpoint (float32, CPU):

- a budget at or above every request's length evicts nothing: greedy output equals the
  uncompressed engine's exactly, in every scheduling regime, for every shipped method;
- StreamingLLM with a small budget: the KV blocks in use stay bounded (exact counts per
  step), the counters and per-request metrics say what was evicted;
- with evictions (StreamingLLM, H2O, SnapKV; the prefill in one step or in chunks), the
  greedy tokens equal transformers run over the whole sequence with each query's attention
  restricted to the tokens its step's table held (original RoPE positions): the compacted
  table, the positions and the slot mapping compute exactly that attention.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.config.named_models import resolve_model
from workbench.core.kv_cache.compression.policy import registered_methods

from .conftest import mixed_prompts

MODEL = resolve_model("bundled")
VOCAB = 1024
NUM_OUTPUT = 12

REGIMES: dict[str, dict[str, Any]] = {
    "plain": {},
    "chunked_prefill_preemption": {"max_num_batched_tokens": 16, "num_gpu_blocks_override": 34},
}


def generate(prompts: list[list[int]], max_tokens: int = NUM_OUTPUT,
             **kwargs: Any) -> tuple[list[list[int]], LLM]:
    kwargs.setdefault("block_size", 4)
    kwargs.setdefault("max_num_seqs", 8)
    llm = LLM(MODEL, dtype="float32", max_model_len=128, enforce_eager=True, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    llm.engine.scheduler.kv_cache_manager.check_integrity()
    assert not llm.engine.has_unfinished_requests()
    return [o.outputs[0].token_ids for o in outs], llm


@pytest.fixture(scope="module")
def plain_outputs() -> dict[str, list[list[int]]]:
    prompts = mixed_prompts(VOCAB)
    return {regime: generate(prompts, **kw)[0] for regime, kw in REGIMES.items()}


FULL_BUDGETS = {  # at or above the longest request (70 + 12 tokens)
    "streaming_llm": {"budget_tokens": 128},
    "h2o": {"budget_tokens": 128},
    "snapkv": {"budget_tokens": 128},
    "pyramidkv": {"budget_tokens": 128},
}


@pytest.mark.parametrize("method", registered_methods())
@pytest.mark.parametrize("regime", list(REGIMES))
def test_budget_at_full_length_equals_the_uncompressed_engine(
    method: str, regime: str, plain_outputs: dict[str, list[list[int]]]
) -> None:
    kc = {"method": method, **FULL_BUDGETS[method]}
    got, llm = generate(mixed_prompts(VOCAB), kv_compression_config=kc, **REGIMES[regime])
    assert got == plain_outputs[regime]
    stats = llm.stats()
    assert stats["workbench:kv_evicted_blocks"] == 0
    if regime == "chunked_prefill_preemption":
        assert stats["vllm:num_preemptions"] > 0


def test_streaming_llm_small_budget_bounds_the_blocks_in_use() -> None:
    llm = LLM(MODEL, dtype="float32", max_model_len=128, enforce_eager=True, block_size=4,
              max_num_batched_tokens=64, max_num_seqs=8,
              kv_compression_config={"method": "streaming_llm", "budget_tokens": 16,
                                     "sink_tokens": 4})
    engine = llm.engine
    kv = engine.scheduler.kv_cache_manager
    prompt = mixed_prompts(VOCAB)[1][:40]
    req = engine.make_request({"prompt_token_ids": prompt},
                              SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))
    engine.add_request(req)
    in_use = []
    while engine.has_unfinished_requests():
        engine.step()
        if engine.has_unfinished_requests():
            in_use.append(kv.num_blocks - 1 - kv.num_free_blocks)
    # the prefill holds its 10 blocks; the first decode keeps the sink block and the 3 most
    # recent (7 out), then one block out per 4 tokens: 4 blocks for the rest of the request
    assert in_use == [10] + [4] * 58
    stats = llm.stats()
    assert stats["workbench:kv_evicted_blocks"] == 7 + 14
    assert stats["workbench:kv_blocks_in_use"] == 0  # all freed after the last step
    assert len(req.output_token_ids) == 60
    assert (req.times.kv_evicted_blocks, req.times.kv_kept_tokens) == (21, 15)
    readout = llm.memory_readout()
    assert readout["kv_compression"] == {"method": "streaming_llm", "budget_tokens": 16,
                                         "sink_tokens": 4, "recent_tokens": None}
    assert readout["kv_budget_blocks_per_request"] == 4


def run_recording_kept_blocks(prompt: list[int], num_output: int, **kwargs: Any
                              ) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
    """Greedy output and, per step, (num_computed_tokens, scheduled tokens, the logical
    blocks the request holds when its forward runs)."""
    llm = LLM(MODEL, dtype="float32", max_model_len=128, enforce_eager=True, block_size=4,
              max_num_seqs=4, **kwargs)
    engine = llm.engine
    sched = engine.scheduler
    steps: list[tuple[int, int, list[int]]] = []
    schedule = sched.schedule

    def recording_schedule() -> Any:
        out = schedule()
        for rid, n in out.num_scheduled_tokens.items():
            r = sched.requests[rid]
            steps.append((r.num_computed_tokens, n,
                          sched.kv_cache_manager.kept_logical_blocks(rid)))
        return out

    sched.schedule = recording_schedule  # type: ignore[method-assign]
    req = engine.make_request({"prompt_token_ids": prompt}, SamplingParams(
        temperature=0.0, max_tokens=num_output, ignore_eos=True))
    engine.add_request(req)
    while engine.has_unfinished_requests():
        engine.step()
    return list(req.output_token_ids), steps


SHARED_TABLE_METHODS = {  # one block set for every layer: the mask below is exact
    "streaming_llm": {"method": "streaming_llm", "budget_tokens": 16, "sink_tokens": 4},
    "h2o": {"method": "h2o", "budget_tokens": 16},
    "snapkv": {"method": "snapkv", "budget_tokens": 16, "window_size": 4, "kernel_size": 3},
}


@pytest.mark.parametrize("chunk", [128, 8])
@pytest.mark.parametrize("method", list(SHARED_TABLE_METHODS))
def test_eviction_equals_transformers_with_the_kept_tokens_masked_in(method: str,
                                                                     chunk: int) -> None:
    """Each query may attend to the tokens of the blocks its step's table holds, up to
    itself, at their original positions: transformers over the whole sequence with that
    mask must give the engine's greedy tokens (a prefill in one step, or in chunks of 8
    with evictions between them)."""
    from transformers import AutoModelForCausalLM

    bs = 4
    prompt = mixed_prompts(VOCAB)[1][:30]
    out, steps = run_recording_kept_blocks(
        prompt, 24, max_num_batched_tokens=chunk,
        kv_compression_config=SHARED_TABLE_METHODS[method])
    if method == "streaming_llm" and chunk == 128:  # the sink block and the 3 most recent
        assert steps[0] == (0, 30, list(range(8)))
        assert all(kept == [0, *range(nc // bs - 2, nc // bs + 1)]
                   for nc, _, kept in steps[1:])
    elif method == "streaming_llm":
        assert [kept for _, _, kept in steps[:4]] == [[0, 1], [0, 1, 2, 3], [0, 3, 4, 5],
                                                      [0, 5, 6, 7]]
    seq = prompt + out[:-1]
    n = len(seq)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for nc, num, kept in steps:
        for q in range(nc, nc + num):
            allowed[q, [p for p in range(q + 1) if p // bs in kept]] = True
    q0 = len(prompt)
    assert not bool(allowed[q0, : q0 + 1].all())  # the first decode already drops some
    mask = torch.zeros(1, 1, n, n, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.inference_mode():
        logits = model(torch.tensor([seq]), attention_mask=mask,
                       position_ids=torch.arange(n)[None]).logits[0]
    assert logits[len(prompt) - 1:].argmax(-1).tolist() == out


def test_fp8_kv_cache_with_a_full_budget_equals_fp8_without() -> None:
    prompts = mixed_prompts(VOCAB)[:5]
    plain, _ = generate(prompts, kv_cache_dtype="fp8", calculate_kv_scales=True)
    got, llm = generate(prompts, kv_cache_dtype="fp8", calculate_kv_scales=True,
                        kv_compression_config={"method": "streaming_llm", "budget_tokens": 128})
    assert got == plain
    small, llm = generate(prompts, kv_cache_dtype="fp8",
                          kv_compression_config={"method": "streaming_llm", "budget_tokens": 16})
    assert llm.stats()["workbench:kv_evicted_blocks"] > 0
    assert [len(s) for s in small] == [NUM_OUTPUT] * 5
