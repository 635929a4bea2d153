"""Greedy output of the engine equals transformers `generate`, token for token, in every regime:
chunked prefill far below the prompt lengths, prefix caching with shared prefixes, a pool so
small that preemption must happen, block sizes 4 and 16, n = 2 with copy-on-write, and all of
them at once. 10 mixed-length prompts (3..70 tokens) run in one batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workbench import LLM, SamplingParams

from .conftest import ARCHS, NUM_OUTPUT

REGIMES: dict[str, dict[str, Any]] = {
    "plain": {},
    "chunked_prefill": {"max_num_batched_tokens": 16, "max_num_seqs": 8},
    "no_chunked_prefill": {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 128, "max_num_seqs": 16,
    },
    "prefix_cache_bs16": {"block_size": 16},
    "preemption": {"num_gpu_blocks_override": 33, "block_size": 4},
    "combined": {
        "max_num_batched_tokens": 24, "max_num_seqs": 8, "num_gpu_blocks_override": 34,
        "block_size": 4,
    },
}


def run_engine(path: Path, prompts: list[list[int]], n: int = 1, **kwargs: Any) -> tuple[
    list[list[list[int]]], dict[str, float]
]:
    kwargs.setdefault("block_size", 4)
    llm = LLM(path, dtype="float32", max_model_len=128, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True, n=n)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    llm.engine.scheduler.kv_cache_manager.check_integrity()
    assert not llm.engine.has_unfinished_requests()
    return [[o.token_ids for o in out.outputs] for out in outs], llm.stats()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("regime", list(REGIMES))
def test_greedy_equals_transformers(
    arch: str, regime: str, checkpoints: dict[str, Path], references: dict[str, Any]
) -> None:
    prompts, expected = references[arch]
    got, stats = run_engine(checkpoints[arch], prompts, **REGIMES[regime])
    assert [g[0] for g in got] == expected
    assert stats["vllm:generation_tokens"] == NUM_OUTPUT * len(prompts)
    assert stats["vllm:prompt_tokens"] == sum(len(p) for p in prompts)
    if regime in ("preemption", "combined"):
        assert stats["vllm:num_preemptions"] > 0
    if regime.startswith("prefix") or regime == "plain":
        # The last four prompts share 37 tokens: 9 blocks of 4 (bs 4) or 2 of 16 each.
        assert stats["vllm:prefix_cache_hits"] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_n2_both_sequences_equal_reference(
    arch: str, checkpoints: dict[str, Path], references: dict[str, Any]
) -> None:
    prompts, expected = references[arch]
    got, _ = run_engine(checkpoints[arch], prompts, n=2)
    assert got == [[e, e] for e in expected]


def test_n2_combined_with_preemption_and_chunking(
    checkpoints: dict[str, Path], references: dict[str, Any]
) -> None:
    prompts, expected = references["llama"]
    got, stats = run_engine(checkpoints["llama"], prompts, n=2, **REGIMES["combined"])
    assert got == [[e, e] for e in expected]
    assert stats["vllm:num_preemptions"] > 0


def test_prefix_hits_on_a_second_generate(
    checkpoints: dict[str, Path], references: dict[str, Any]
) -> None:
    prompts, expected = references["qwen3"]
    llm = LLM(checkpoints["qwen3"], dtype="float32", max_model_len=128, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    ids = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(ids, params)
    before = llm.stats()["vllm:prefix_cache_hits"]
    outs = llm.generate(ids, params)
    assert [o.outputs[0].token_ids for o in outs] == expected
    # Every prompt is found again: (len - 1) // 4 full blocks each.
    hits = llm.stats()["vllm:prefix_cache_hits"] - before
    assert hits == sum(4 * ((len(p) - 1) // 4) for p in prompts)
    assert sum(o.num_cached_tokens for o in outs) == hits
    assert llm.reset_prefix_cache() is True
    outs = llm.generate(ids[:1], params)
    assert outs[0].num_cached_tokens == 0
