"""Speculative decoding end to end: lossless greedy output, exact counters, sampled
distributions equal to the non-speculative engine's."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import chi2_contingency

from tests.engine.conftest import mixed_prompts
from workbench import LLM, SamplingParams
from workbench.testing import tiny_checkpoint

VOCAB = 1024
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("spec") / "target", arch="llama", seed=0)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same tokenizer and vocabulary as the target, other random weights: partial acceptance."""
    return tiny_checkpoint(
        tmp_path_factory.mktemp("spec") / "draft", arch="llama", seed=1, num_hidden_layers=1
    )


@pytest.fixture(scope="module")
def near_draft(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with noise added to every weight: a draft whose q is close to, but not,
    the target's p (high acceptance, and residuals max(0, p - q) unlike p)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("spec") / "near"
    shutil.copytree(target, out)
    gen = torch.Generator().manual_seed(0)
    weights = load_file(out / "model.safetensors")
    noisy = {k: v + 0.3 * v.std() * torch.randn(v.shape, generator=gen) for k, v in weights.items()}
    save_file(noisy, out / "model.safetensors", metadata={"format": "pt"})
    return out


def prompts() -> list[list[int]]:
    """Mixed lengths (3..70), four sharing a 37-token prefix, plus two self-repeating ones
    (n-gram food)."""
    rng = random.Random(1)
    out = mixed_prompts(VOCAB)
    for n in (12, 30):
        body = [rng.randrange(10, VOCAB) for _ in range(n)]
        out.append(body + body + body[: n // 2])
    return out


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
# Chunked prefill with a budget below the longest prompts, small blocks, prefix caching on.
KNOBS: dict[str, Any] = dict(max_num_batched_tokens=48, max_num_seqs=8, block_size=4)


def run(path: Path, spec: dict[str, Any] | None, params: SamplingParams = GREEDY,
        ps: list[list[int]] | None = None, **knobs: Any) -> tuple[list[list[int]], LLM]:
    llm = LLM(path, speculative_config=spec, **{**KNOBS, **knobs})
    outs = llm.generate(ps if ps is not None else prompts(), params)
    llm.engine.scheduler.kv_cache_manager.check_integrity()
    return [c.token_ids for o in outs for c in o.outputs], llm


@pytest.fixture(scope="module")
def reference(target: Path) -> list[list[int]]:
    return run(target, None)[0]


def spec_counts(llm: LLM) -> tuple[int, int, int, list[int]]:
    st = llm.stats()
    return (int(st["vllm:spec_decode_num_drafts"]), int(st["vllm:spec_decode_num_draft_tokens"]),
            int(st["vllm:spec_decode_num_accepted_tokens"]),
            st.get("vllm:spec_decode_num_accepted_tokens_per_pos", []))


def test_ngram_greedy_is_lossless(target: Path, reference: list[list[int]]) -> None:
    """Random weights rarely continue a repeat, so almost every n-gram draft is rejected and
    rolled back here; acceptance is tested on the trained demo target below."""
    outs, llm = run(target, NGRAM)
    assert outs == reference
    drafts, drafted, accepted, per_pos = spec_counts(llm)
    assert drafts > 0 and drafted > drafts and accepted < drafted
    assert sum(per_pos) == accepted
    assert llm.stats()["vllm:prefix_cache_hits"] > 0
    # every output token is counted once, whatever the verification emitted
    assert llm.stats()["vllm:generation_tokens"] == sum(len(o) for o in outs)


def test_draft_equal_to_target_accepts_every_draft(
    target: Path, reference: list[list[int]]
) -> None:
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens": 3}
    outs, llm = run(target, spec)
    assert outs == reference
    drafts, drafted, accepted, per_pos = spec_counts(llm)
    assert drafts > 0 and accepted == drafted
    assert per_pos[0] == drafts  # every verification accepted its first draft
    assert llm.stats()["vllm:prefix_cache_hits"] > 0


def test_other_draft_is_lossless_with_rejections(
    target: Path, other_draft: Path, reference: list[list[int]]
) -> None:
    spec = {"method": "draft_model", "model": str(other_draft), "num_speculative_tokens": 3}
    outs, llm = run(target, spec)
    assert outs == reference
    drafts, drafted, accepted, _ = spec_counts(llm)
    assert 0 < accepted < drafted


def test_preemption_and_prefix_hits_keep_the_draft_kv_valid(target: Path) -> None:
    """A pool so small that requests are preempted and recomputed: with the draft equal to
    the target every draft must still be accepted, so the draft's KV (reset on preemption,
    reused through prefix hits) is never stale."""
    ref, _ = run(target, None, num_gpu_blocks_override=48, max_model_len=128)
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens": 3}
    outs, llm = run(target, spec, num_gpu_blocks_override=48, max_model_len=128)
    assert outs == ref
    assert llm.stats()["vllm:num_preemptions"] > 0
    _, drafted, accepted, _ = spec_counts(llm)
    assert accepted == drafted > 0


def test_n2_siblings_each_draft_with_their_own_draft_kv(target: Path) -> None:
    params = SamplingParams(n=2, temperature=0.0, max_tokens=12, ignore_eos=True)
    ps = prompts()[:4]
    ref, _ = run(target, None, params, ps)
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens": 3}
    outs, llm = run(target, spec, params, ps)
    assert outs == ref
    _, drafted, accepted, _ = spec_counts(llm)
    assert accepted == drafted > 0


def test_draft_with_another_vocabulary_is_refused(target: Path, tmp_path: Path) -> None:
    bad = tiny_checkpoint(tmp_path / "bad", arch="llama", seed=0, vocab_size=512)
    with pytest.raises(ValueError, match="vocab_size"):
        LLM(target, speculative_config={"method": "draft_model", "model": str(bad)})


def _token_counts(path: Path, spec: dict[str, Any] | None, n: int, pos: int) -> Counter[int]:
    prompt = prompts()[-1][:20]
    llm = LLM(path, speculative_config=spec, max_num_seqs=256)
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=pos + 3, ignore_eos=True,
                             seed=10_000 + i) for i in range(n)]
    outs = llm.generate([prompt] * n, params)
    return Counter(o.outputs[0].token_ids[pos] for o in outs)


def test_sampled_tokens_follow_the_non_speculative_distribution(
    target: Path, near_draft: Path
) -> None:
    """End to end: output token 1 (the first one the rejection sampler emits) has the same
    distribution with and without speculation (chi-square test of homogeneity, 2000 seeded
    draws each, alpha 1e-3). The near draft accepts often, so a sampler that resampled from
    p instead of max(0, p - q) after a rejection fails this (checked: p ~ 1e-7)."""
    n, pos = 2000, 1
    base = _token_counts(target, None, n, pos)
    for spec in (
        {"method": "draft_model", "model": str(near_draft), "num_speculative_tokens": 2},
        NGRAM,
    ):
        got = _token_counts(target, spec, n, pos)
        cats = [t for t in set(base) | set(got) if base[t] + got[t] >= 10]
        table = [[base[t] for t in cats] + [n - sum(base[t] for t in cats)],
                 [got[t] for t in cats] + [n - sum(got[t] for t in cats)]]
        if table[0][-1] + table[1][-1] == 0:
            table = [row[:-1] for row in table]
        assert len(cats) >= 3  # a real distribution, not a point mass
        p_value = chi2_contingency(table)[1]
        assert p_value > 1e-3, (spec["method"], p_value, table)


def test_a_request_finishing_in_the_step_gets_no_drafts(
    target: Path, reference: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner drafts for every request it sampled, before the scheduler sees the stop
    token; the drafts of a request that finished in that step are not kept."""
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens": 3}
    engine = LLM(target, speculative_config=spec, **KNOBS).engine
    outputs: list[Any] = []
    real = engine.runner.execute_model

    def execute_model(*args: Any) -> Any:
        outputs.append(real(*args))
        return outputs[-1]

    monkeypatch.setattr(engine.runner, "execute_model", execute_model)
    for i, p in enumerate(prompts()):
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                stop_token_ids=[reference[i][5]])
        engine.add_request(engine.make_request({"prompt_token_ids": p}, params))
    finished_with_drafts = 0
    while engine.has_unfinished_requests():
        n = len(outputs)
        done = [r for r in engine.step() if r.is_finished()]
        drafts = outputs[n].spec_token_ids if len(outputs) > n else {}
        for req in done:
            assert req.status.finish_reason == "stop"
            assert req.spec_token_ids == []
            finished_with_drafts += req.request_id in drafts
            ref = reference[int(req.request_id)]
            assert req.output_token_ids == ref[: ref.index(req.output_token_ids[-1]) + 1]
    assert finished_with_drafts > 0  # the case happened: drafts made, then dropped
