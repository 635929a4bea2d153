"""Sampler semantics: filters on hand-made logits, seeds, and the engine's stop knobs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.sample.metadata import SamplingMetadata
from workbench.sample.sampler import Sampler
from workbench.worker.request_state import CachedRequestState
from workbench.worker.sampling_metadata_builder import SamplingMetadataBuilder

CPU = torch.device("cpu")


def _state(rid: str, params: SamplingParams) -> CachedRequestState:
    """The worker's state of a request with prompt [1, 2, 3] (what the sampler's metadata
    is built from)."""
    return CachedRequestState(rid, [1, 2, 3], params, [], 0, eos_token_id=2)


def _req(**params: Any) -> CachedRequestState:
    return _state("r", SamplingParams(**params))


def _meta(*reqs: CachedRequestState,
          builder: SamplingMetadataBuilder | None = None) -> SamplingMetadata:
    return (builder or SamplingMetadataBuilder(CPU)).build(list(reqs))


def _probs(logits: torch.Tensor, req: CachedRequestState) -> torch.Tensor:
    return Sampler.sampling_probs(logits, _meta(req), [0])


def test_top_k_and_top_p_probabilities_exact() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    p = _probs(logits.clone(), _req(temperature=1.0, top_k=2))
    torch.testing.assert_close(p, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))
    # top_p 0.6: 0.4 alone is < 0.6, so 0.3 joins; 0.2 and 0.1 are dropped.
    p = _probs(logits.clone(), _req(temperature=1.0, top_p=0.6))
    torch.testing.assert_close(p, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7]]))
    # temperature 0.5 squares the odds before normalising.
    p = _probs(logits.clone(), _req(temperature=0.5))
    sq = torch.tensor([0.01, 0.16, 0.04, 0.09])
    torch.testing.assert_close(p, (sq / sq.sum())[None])


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    s = Sampler(0, torch.device("cpu"))
    logits = torch.tensor([[0.0, 0.0, 9.0, 8.0, 1.0]])
    req = _req(temperature=0.0, min_tokens=2, stop_token_ids=[3])
    assert s(logits.clone(), _meta(req)) == [4]  # eos (2) and stop (3) are masked
    req.all_token_ids.extend([4, 4])  # two tokens sampled
    assert s(logits.clone(), _meta(req)) == [2]


def test_sampled_frequencies_follow_the_distribution() -> None:
    s = Sampler(123, torch.device("cpu"))
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = torch.log(probs)[None]
    counts = torch.zeros(4)
    meta = _meta(_req(temperature=1.0))
    for _ in range(4000):
        counts[s(logits.clone(), meta)[0]] += 1
    chi2 = float((((counts - 4000 * probs) ** 2) / (4000 * probs)).sum())
    assert chi2 < 16.27  # chi-square, 3 dof, p = 0.001


@pytest.fixture(scope="module")
def llm(checkpoints: dict[str, Path]) -> LLM:
    return LLM(checkpoints["qwen2"], dtype="float32", max_model_len=128, block_size=4)


def _gen(llm: LLM, prompts: list[list[int]], **params: Any) -> list[list[list[int]]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(max_tokens=10, ignore_eos=True, **params))
    return [[o.token_ids for o in out.outputs] for out in outs]


def test_same_seed_same_tokens_whatever_the_batch(
    llm: LLM, references: dict[str, Any]
) -> None:
    prompts, greedy = references["qwen2"]
    alone = _gen(llm, prompts[:1], temperature=1.0, seed=7)
    batched = _gen(llm, prompts[:5], temperature=1.0, seed=7)
    assert batched[0] == alone[0]
    other_seed = _gen(llm, prompts[:1], temperature=1.0, seed=8)
    assert other_seed[0] != alone[0]
    # top_k = 1 and a tiny top_p are greedy.
    assert [o[0] for o in _gen(llm, prompts, temperature=1.0, top_k=1)] == [
        g[:10] for g in greedy
    ]
    assert [o[0] for o in _gen(llm, prompts, temperature=0.8, top_p=1e-6)] == [
        g[:10] for g in greedy
    ]


def test_n3_sampling_children_use_their_own_seeds(llm: LLM, references: dict[str, Any]) -> None:
    prompts, _ = references["qwen2"]
    out = _gen(llm, prompts[1:2], temperature=1.0, seed=100, n=3)[0]
    assert len(out) == 3 and all(len(o) == 10 for o in out)
    assert len({tuple(o) for o in out}) == 3
    assert out == _gen(llm, prompts[1:2], temperature=1.0, seed=100, n=3)[0]
    # Child i draws with seed + i.
    assert out[0] == _gen(llm, prompts[1:2], temperature=1.0, seed=100)[0][0]
    assert out[2] == _gen(llm, prompts[1:2], temperature=1.0, seed=102)[0][0]


def test_stop_token_ids_and_finish_reasons(llm: LLM, references: dict[str, Any]) -> None:
    prompts, greedy = references["qwen2"]
    stop = greedy[1][4]
    first = greedy[1].index(stop)
    outs = llm.generate([{"prompt_token_ids": prompts[1]}],
                        SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop]))
    o = outs[0].outputs[0]
    assert o.token_ids == greedy[1][: first + 1]
    assert (o.finish_reason, o.stop_reason) == ("stop", stop)
    outs = llm.generate([{"prompt_token_ids": prompts[1]}],
                        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    assert outs[0].outputs[0].finish_reason == "length"
    m = outs[0].metrics
    assert m is not None and len(m.token_times) == 3
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
    assert math.isclose(m.first_token_time, m.token_times[0])


def test_greedy_ids_take_the_first_maximum_like_argmax() -> None:
    import torch

    from workbench.sample.sampler import greedy_ids

    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0],
                      [float("-inf"), 2.0, float("-inf"), 2.0], [0.0, 0.0, 0.0, 7.0]])
    assert greedy_ids(x) == [1, 0, 1, 3] == x.argmax(dim=-1).tolist()
    big = torch.randn(64, 8192, generator=torch.Generator().manual_seed(0))
    assert greedy_ids(big) == big.argmax(dim=-1).tolist()


def _reference_top_p_drop(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The top-p mask through torch.sort's indices (the sampler's definition)."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    drop_sorted = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None]
    return torch.zeros_like(drop_sorted).scatter(1, idx, drop_sorted)


@pytest.mark.parametrize("ties", [False, True])
def test_top_p_mask_and_sorted_values_equal_torch_sort(ties: bool) -> None:
    from workbench.sample.sampler import sorted_desc_values, top_p_drop

    gen = torch.Generator().manual_seed(3)
    for trial in range(20):
        logits = torch.randn(16, 512, generator=gen) * 1.6
        if ties:  # many equal values, so cuts often split a run of ties
            logits = (logits * 2).round() / 2
        logits[0, :200] = float("-inf")  # a top-k'd row
        top_p = torch.tensor([0.5, 0.9, 0.95, 1.0, 1e-6, 0.999, 0.3, 0.8] * 2)
        assert torch.equal(sorted_desc_values(logits),
                           logits.sort(dim=-1, descending=True).values)
        assert torch.equal(top_p_drop(logits, top_p), _reference_top_p_drop(logits, top_p)), trial


def test_batched_draws_equal_row_by_row_draws() -> None:
    reqs = [_state(str(i), SamplingParams(temperature=0.7, top_p=0.9,
                                          seed=i if i % 2 else None)) for i in range(6)]
    reqs.insert(2, _state("g", SamplingParams(temperature=0.0)))
    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(0)) * 1.6
    meta = SamplingMetadataBuilder(CPU).build(reqs)
    got = Sampler(5, CPU)(logits.clone(), meta)
    # row by row: each sampled row draws vocab-many Exp(1) from its own generator (the
    # sampler's for unseeded rows, in row order), argmax(p / E)
    ref_meta = SamplingMetadataBuilder(CPU).build(reqs)
    engine_gen = torch.Generator().manual_seed(5)
    probs = Sampler.sampling_probs(logits[ref_meta.random_rows], ref_meta, ref_meta.random_rows)
    want = logits.max(dim=-1).indices.tolist()
    for j, i in enumerate(ref_meta.random_rows):
        noise = torch.empty(300).exponential_(generator=ref_meta.generators.get(i, engine_gen))
        want[i] = int((probs[j] / noise).argmax())
    assert got == want
