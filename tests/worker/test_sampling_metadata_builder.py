"""SamplingMetadata from scheduled requests: exact tensors, generators kept across steps and
dropped for finished requests, drafts for verification, per-request failure isolation."""

from __future__ import annotations

import torch

from workbench.sample.sampler import Sampler
from workbench.sampling_params import SamplingParams
from workbench.worker.request_state import CachedRequestState
from workbench.worker.sampling_metadata_builder import SamplingMetadataBuilder

CPU = torch.device("cpu")
EOS = 2


def _req(rid: str, num_output: int = 0, **params: object) -> CachedRequestState:
    """The worker's state of a 3-token prompt with `num_output` tokens sampled."""
    sp = SamplingParams(**params)  # type: ignore[arg-type]
    req = CachedRequestState(rid, [11, 12, 13], sp, [], 0, eos_token_id=EOS)
    req.all_token_ids.extend([20] * num_output)
    return req


def _mixed() -> list[CachedRequestState]:
    return [
        _req("a", temperature=0.0, min_tokens=2, stop_token_ids=[7]),
        _req("b", temperature=0.8, top_k=50, seed=3),
        _req("c", num_output=1, temperature=1.0, top_p=0.9, min_tokens=1),
        _req("d", num_output=1, temperature=0.0, max_tokens=9, min_tokens=3),
    ]


def test_mixed_batch_exact_metadata() -> None:
    builder = SamplingMetadataBuilder(CPU)
    meta = builder.build(_mixed())
    assert meta.request_ids == ["a", "b", "c", "d"]
    assert (meta.all_greedy, meta.all_random) == (False, False)
    assert meta.random_rows == [1, 2]
    assert meta.temperature is not None and meta.top_k is not None and meta.top_p is not None
    torch.testing.assert_close(meta.temperature, torch.tensor([0.0, 0.8, 1.0, 0.0]))
    assert meta.temperature.dtype == torch.float32
    assert meta.top_k.tolist() == [0, 50, 0, 0] and meta.top_k.dtype == torch.int64
    torch.testing.assert_close(meta.top_p, torch.tensor([1.0, 1.0, 0.9, 1.0]))
    # only the seeded sampled request has a generator of its own
    assert list(meta.generators) == [1]
    assert meta.generators[1] is builder.generators["b"]
    # a: 2 outputs to come before EOS or 7; c has its 1; d needs 2 more (EOS only)
    assert meta.min_tokens == {0: (2, [7, EOS]), 3: (2, [EOS])}
    assert meta.spec_token_ids is None and meta.draft_probs is None


def test_all_greedy_builds_no_tensors() -> None:
    reqs = [_req("a", temperature=0.0), _req("b", temperature=0.0)]
    meta = SamplingMetadataBuilder(CPU).build(reqs)
    assert (meta.all_greedy, meta.all_random, meta.random_rows) == (True, False, [])
    assert meta.temperature is None and meta.top_k is None and meta.top_p is None
    assert meta.generators == {} and meta.min_tokens == {}


def test_unfiltered_sampling_has_no_filter_tensors() -> None:
    meta = SamplingMetadataBuilder(CPU).build([_req("a", temperature=0.7)])
    assert (meta.all_greedy, meta.all_random) == (False, True)
    assert meta.top_k is None and meta.top_p is None


def test_generators_persist_across_steps_until_the_request_finishes() -> None:
    builder = SamplingMetadataBuilder(CPU)
    sampler = Sampler(0, CPU)
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    # step 1: b in a mixed batch; step 2: b alone (another row index)
    first = sampler(logits.clone(), builder.build(_mixed()))[1]
    b = _mixed()[1]
    second = sampler(logits[1:2].clone(), builder.build([b]))[0]
    # the same draws as a fresh sampler drawing twice for b alone: the batch does not matter
    alone = SamplingMetadataBuilder(CPU)
    fresh = Sampler(0, CPU)
    assert [fresh(logits[1:2].clone(), alone.build([b]))[0] for _ in range(2)] == [first, second]
    # finished: the generator is dropped, a reused id starts from its seed again
    gen = builder.generators["b"]
    builder.remove_requests(["b", "unknown"])
    assert "b" not in builder.generators
    assert builder.build([b]).generators[0] is not gen
    assert sampler(logits[1:2].clone(), builder.build([b]))[0] == first


def test_verification_carries_drafts_and_draft_probs() -> None:
    reqs = [_req("a", temperature=0.0), _req("b", temperature=1.0)]
    q = torch.full((2, 8), 1 / 8)
    reqs[1].spec_token_probs = q
    meta = SamplingMetadataBuilder(CPU).build(reqs, {"b": [5, 6]})
    assert meta.spec_token_ids == [[], [5, 6]]
    assert meta.draft_probs is not None
    assert meta.draft_probs[0] is None and meta.draft_probs[1] is q


def test_a_request_with_broken_params_fails_alone() -> None:
    reqs = _mixed()
    reqs[2].sampling_params.temperature = "hot"  # type: ignore[assignment]  # past validation
    failed: dict[str, str] = {}
    meta = SamplingMetadataBuilder(CPU).build(reqs, failed=failed)
    assert list(failed) == ["c"] and failed["c"].startswith("sampling failed: ")
    assert meta.temperature is not None
    torch.testing.assert_close(meta.temperature, torch.tensor([0.0, 0.8, 1.0, 0.0]))
    tokens = Sampler(0, CPU)(torch.randn(4, 64), meta, failed=failed)
    assert tokens[2] == -1 and all(t >= 0 for i, t in enumerate(tokens) if i != 2)
