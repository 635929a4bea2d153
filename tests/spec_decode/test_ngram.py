"""N-gram (prompt lookup) proposer: vLLM's matching rule with exact drafts."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.config import SpeculativeConfig
from workbench.core.sched.output import SchedulerOutput
from workbench.sampling_params import SamplingParams
from workbench.spec_decode.ngram import NgramProposer, propose_ngram
from workbench.worker.request_state import CachedRequestState


def _p(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    return propose_ngram(np.asarray(tokens, dtype=np.int64), min_n, max_n, k)


def test_vllm_docstring_example() -> None:
    # [4,2,3] does not recur; [2,3] does at 1 -> the three tokens after it
    assert _p([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]


def test_longest_ngram_wins_over_a_shorter_later_one() -> None:
    ctx = [5, 6, 7, 8, 1, 9, 7, 0, 6, 7]
    # n=2 suffix [6, 7] matches at 1 -> [8, 1, 9]; n=1 [7] would match at 2 too (same), but
    # a context where only the 1-gram matches later shows the preference:
    assert _p(ctx, 1, 2, 3) == [8, 1, 9]
    assert _p([3, 7, 4, 4, 1, 2, 7], 1, 3, 2) == [4, 4]


def test_earliest_occurrence_of_the_longest_match() -> None:
    assert _p([1, 2, 10, 1, 2, 20, 1, 2], 2, 2, 1) == [10]


def test_no_match_or_too_short() -> None:
    assert _p([1, 2, 3, 4], 1, 3, 5) == []
    assert _p([1, 2, 1, 3], 2, 3, 5) == []  # only a 1-gram recurs, min is 2
    assert _p([7], 1, 1, 3) == []
    assert _p([1, 1, 1], 1, 1, 0) == []


def test_draft_stops_at_the_end_of_the_context() -> None:
    assert _p([1, 2, 3, 1, 2], 2, 2, 5) == [3, 1, 2]


def _req(tokens: list[int], max_tokens: int, num_output: int = 0,
         rid: str = "r") -> CachedRequestState:
    """The worker's state of a request: `tokens`, the last `num_output` of them sampled."""
    req = CachedRequestState(rid, tokens[: len(tokens) - num_output],
                             SamplingParams(max_tokens=max_tokens), [], 0)
    req.all_token_ids.extend(tokens[len(tokens) - num_output:])
    return req


def _drafts(prop: NgramProposer, req: CachedRequestState, sampled: list[int]) -> list[int]:
    drafts = prop.propose([req], SchedulerOutput(), {req.req_id: sampled}).token_ids
    return drafts.get(req.req_id, [])


def test_k_is_capped_by_max_model_len_and_max_tokens() -> None:
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_min=1,
                            prompt_lookup_max=2)
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    prop = NgramProposer(cfg, max_model_len=100)
    # the runner proposes before the sampled token (2) is appended to the request
    req = _req(tokens[:-1], max_tokens=50)
    assert _drafts(prop, req, [2]) == [3, 4, 5, 6, 7]
    # max_model_len 12: at most 3 more positions
    assert _drafts(NgramProposer(cfg, max_model_len=12), req, [2]) == [3, 4, 5]
    # max_tokens 4 with 1 output: 3 more tokens, the last one the bonus -> 2 drafts
    req = _req(tokens[:-1], max_tokens=4)
    assert _drafts(prop, req, [2]) == [3, 4]


def test_only_requests_that_got_tokens_draft() -> None:
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=2, prompt_lookup_min=1,
                            prompt_lookup_max=2)
    a, b = _req([1, 2, 3, 1], 16, rid="a"), _req([1, 2, 1], 16, rid="b")
    proposal = NgramProposer(cfg, max_model_len=100).propose([a, b], SchedulerOutput(),
                                                             {"b": [2]})
    assert proposal.token_ids == {"b": [1, 2]} and proposal.probs == {}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"method": "medusa"}, "method"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"method": "ngram", "prompt_lookup_max": 0}, "prompt_lookup_max"),
        ({"method": "draft_model"}, "model"),
        ({"method": "draft_model", "model": "/nonexistent"}, "model"),
        ({"method": "ngram", "num_speculative_tokens": 3, "bogus": 1}, "bogus"),
        ({"num_speculative_tokens": 3}, "method"),
    ],
)
def test_bad_speculative_config_names_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig.from_dict(spec)  # type: ignore[arg-type]


def test_vllm_lookup_defaults() -> None:
    assert SpeculativeConfig.from_dict({"method": "ngram"}).prompt_lookup_min == 5
    c = SpeculativeConfig.from_dict({"method": "ngram", "prompt_lookup_max": 3})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (3, 3)
