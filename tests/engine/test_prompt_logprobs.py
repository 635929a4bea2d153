"""SamplingParams(prompt_logprobs=k): the engine's prompt logprobs equal transformers' log_softmax
on the same tiny checkpoint, position for position, in every regime that changes how a prompt
reaches the model: one prefill, chunked prefill over several steps, a second identical prompt
(no prefix-cache hit: every position's logits are computed), preemption by recompute (no
position twice), n = 2 (one set, the parent's). Plus vLLM's rank definition, k = 0, k = -1,
the dict form and validation.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.core.outputs import LogprobsTensors
from workbench.engine.outputs import Logprob, RequestOutput

ATOL = 2e-5  # fp32: the engine's paged attention against transformers' eager attention


@pytest.fixture(scope="module")
def path(checkpoints: dict[str, Path]) -> Path:
    return checkpoints["llama"]


@pytest.fixture(scope="module")
def prompts(path: Path) -> list[list[int]]:
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    rng = random.Random(1)
    return [[rng.randrange(10, vocab) for _ in range(n)] for n in (37, 5, 61)]


@pytest.fixture(scope="module")
def hf_logprobs(path: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    """transformers' [len(prompt) - 1, vocab] float32 log-probabilities, row i at position i."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return [torch.log_softmax(model(input_ids=torch.tensor([p])).logits[0, :-1].float(), -1)
                for p in prompts]


def generate(path: Path, prompts: list[list[int]], k: int | None, n: int = 1,
             max_tokens: int = 3, **kwargs: Any) -> tuple[list[RequestOutput], LLM]:
    kwargs.setdefault("block_size", 4)
    llm = LLM(path, dtype="float32", max_model_len=128, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, n=n,
                            prompt_logprobs=k)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    llm.engine.scheduler.kv_cache_manager.check_integrity()
    return outs, llm


def check_against(t: LogprobsTensors, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    """Actual-token logprob and rank, and the top-k, equal the reference's."""
    rows = len(prompt) - 1
    target = torch.tensor(prompt[1:])
    chosen = ref[torch.arange(rows), target]
    assert t.start == 0 and len(t) == rows
    assert t.logprob_token_ids[:, 0].tolist() == prompt[1:]
    torch.testing.assert_close(t.token_logprobs, chosen, atol=ATOL, rtol=0)
    assert t.selected_token_ranks.tolist() == (1 + (ref > chosen[:, None]).sum(-1)).tolist()
    if k == -1:
        assert t.logprobs.shape == (rows, 1) and t.full_logprobs is not None
        torch.testing.assert_close(t.full_logprobs, ref, atol=ATOL, rtol=0)
    else:
        assert t.full_logprobs is None and t.logprobs.shape == (rows, 1 + k)
        top = ref.topk(k, dim=-1) if k else None
        if top is not None:
            assert t.logprob_token_ids[:, 1:].tolist() == top.indices.tolist()
            torch.testing.assert_close(t.logprobs[:, 1:], top.values, atol=ATOL, rtol=0)


REGIMES: dict[str, dict[str, Any]] = {
    "one_prefill": {},
    "chunked_prefill": {"max_num_batched_tokens": 8, "max_num_seqs": 4},
    # 32 usable blocks of 4 for 3 sequences of 77, 45 and 101 tokens: a decode preempts
    "preemption": {"num_gpu_blocks_override": 33, "max_num_batched_tokens": 16,
                   "max_num_seqs": 4, "max_tokens": 40},
}


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("k", [0, 3, -1])
def test_prompt_logprobs_equal_transformers(
    path: Path, prompts: list[list[int]], hf_logprobs: list[torch.Tensor], regime: str, k: int
) -> None:
    outs, llm = generate(path, prompts, k, **REGIMES[regime])
    if regime == "preemption":
        assert llm.stats()["vllm:num_preemptions"] > 0
    for out, p, ref in zip(outs, prompts, hf_logprobs, strict=True):
        assert out.prompt_logprobs_tensors is not None
        check_against(out.prompt_logprobs_tensors, p, ref, k)
        assert len(out.outputs[0].token_ids) == REGIMES[regime].get("max_tokens", 3)


def test_identical_prompt_is_not_served_from_the_prefix_cache(
    path: Path, prompts: list[list[int]], hf_logprobs: list[torch.Tensor]
) -> None:
    """The second request of the same prompt still gets every position (vLLM skips the
    prefix-cache lookup for prompt-logprobs requests); a plain request afterwards hits the
    blocks they wrote."""
    llm = LLM(path, dtype="float32", max_model_len=128, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    for _ in range(2):
        (out,) = llm.generate([{"prompt_token_ids": prompts[0]}], params)
        assert out.num_cached_tokens == 0 and out.prompt_logprobs_tensors is not None
        check_against(out.prompt_logprobs_tensors, prompts[0], hf_logprobs[0], 1)
    (plain,) = llm.generate([{"prompt_token_ids": prompts[0]}],
                            SamplingParams(temperature=0.0, max_tokens=2))
    assert plain.num_cached_tokens == 36 and plain.prompt_logprobs_tensors is None


def test_n2_one_set_of_prompt_logprobs_and_equal_sequences(
    path: Path, prompts: list[list[int]], hf_logprobs: list[torch.Tensor]
) -> None:
    outs, _ = generate(path, prompts, 2, n=2)
    plain, _ = generate(path, prompts, None)
    for out, p, ref, base in zip(outs, prompts, hf_logprobs, plain, strict=True):
        assert out.prompt_logprobs_tensors is not None
        check_against(out.prompt_logprobs_tensors, p, ref, 2)
        assert [o.token_ids for o in out.outputs] == [base.outputs[0].token_ids] * 2


def test_dict_form_as_vllm(path: Path, prompts: list[list[int]]) -> None:
    """None for the first token; per position the actual token (its own rank) and the top-k
    (ranks 1..k); entries carry no decoded text."""
    (out,), _ = generate(path, prompts[:1], 2)
    t = out.prompt_logprobs_tensors
    lp = out.prompt_logprobs
    assert t is not None and lp is not None
    assert len(lp) == len(prompts[0]) and lp[0] is None
    for i, entry in enumerate(lp[1:]):
        assert entry is not None
        actual = prompts[0][i + 1]
        assert next(iter(entry)) == actual
        assert entry[actual] == Logprob(float(t.logprobs[i, 0]), int(t.selected_token_ranks[i]))
        for place, tok in enumerate(t.logprob_token_ids[i, 1:].tolist()):
            if tok != actual:
                assert entry[tok].rank == place + 1
        assert len(entry) == 3 - (actual in t.logprob_token_ids[i, 1:].tolist())
        assert all(v.decoded_token is None for v in entry.values())


def test_full_vocab_dicts_rank_every_token(path: Path, prompts: list[list[int]]) -> None:
    (out,), _ = generate(path, [prompts[1]], -1)
    t = out.prompt_logprobs_tensors
    lp = out.prompt_logprobs
    assert t is not None and t.full_logprobs is not None and lp is not None
    vocab = t.full_logprobs.shape[1]
    for i, entry in enumerate(lp[1:]):
        assert entry is not None and len(entry) == vocab
        row = t.full_logprobs[i]
        for tok in (0, int(row.argmax()), prompts[1][i + 1]):
            assert entry[tok].rank == 1 + int((row > row[tok]).sum())
        assert entry[int(row.argmax())].rank == 1


def test_rank_counts_strictly_greater_logprobs() -> None:
    """Ties share the better rank: rank = 1 + the number of strictly greater logprobs."""
    from workbench.core.sched.output import SchedulerOutput
    from workbench.worker.prompt_logprobs import compute_prompt_logprobs
    from workbench.worker.request_state import CachedRequestState

    class Model:
        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return hidden

    req = CachedRequestState("r", [0, 2, 1, 0], SamplingParams(prompt_logprobs=1), [1], 0)
    hidden = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0], [0.0, 1.0, 5.0], [9.0, 9.0, 9.0]])
    out = SchedulerOutput(num_scheduled_tokens={"r": 4}, num_prefill_tokens=4)
    run = compute_prompt_logprobs(Model(), [req], out, hidden)["r"]
    assert run.selected_token_ranks.tolist() == [1, 1, 3]  # tie at the top: both rank 1
    assert run.logprob_token_ids[:, 0].tolist() == [2, 1, 0]
    assert len(run) == 3  # the last row predicts the first output token: not a prompt logprob


def test_one_token_prompt_has_no_positions(path: Path) -> None:
    (out,), _ = generate(path, [[42]], 1)
    assert out.prompt_logprobs == [None]
    assert out.prompt_logprobs_tensors is not None and len(out.prompt_logprobs_tensors) == 0


def test_requests_without_prompt_logprobs_get_none(path: Path, prompts: list[list[int]]) -> None:
    (out,), _ = generate(path, prompts[:1], None)
    assert out.prompt_logprobs is None and out.prompt_logprobs_tensors is None


@pytest.mark.parametrize("bad", [-2, 1.5, True, "3"])
def test_prompt_logprobs_must_be_none_minus_one_or_a_count(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"prompt_logprobs \(.*\) must be None, -1"):
        SamplingParams(prompt_logprobs=bad)


def test_prompt_logprobs_above_the_vocabulary_is_refused(path: Path) -> None:
    llm = LLM(path, dtype="float32", max_model_len=64)
    vocab = llm.engine.vocab_size
    with pytest.raises(ValueError, match=rf"prompt_logprobs \({vocab + 1}\) must be <= the "
                                         rf"vocabulary size \({vocab}\)"):
        llm.generate([[11, 12]], SamplingParams(prompt_logprobs=vocab + 1))
    assert not llm.engine.has_unfinished_requests()


def test_a_failing_request_keeps_no_prompt_logprobs(path: Path, prompts: list[list[int]]) -> None:
    """A request whose sampling fails after its prompt logprobs arrived gets none (nothing
    half-built); the other request of the step is unaffected."""
    llm = LLM(path, dtype="float32", max_model_len=128, block_size=4,
              max_num_batched_tokens=16, max_num_seqs=4)
    engine = llm.engine
    add = engine._add_prompt_logprobs

    def failing(out: Any, runs: dict[str, LogprobsTensors], failed: dict[str, str]) -> None:
        add(out, runs, failed)
        req = engine.scheduler.requests.get("0")
        if req is not None and "0" in out.num_scheduled_tokens and \
                req.num_computed_tokens + 16 >= req.num_prompt_tokens:
            failed["0"] = "injected failure"

    engine._add_prompt_logprobs = failing  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0)
    bad, good = llm.generate([{"prompt_token_ids": prompts[2]},
                              {"prompt_token_ids": prompts[0]}], params)
    assert bad.outputs[0].finish_reason == "error" and bad.prompt_logprobs_tensors is None
    assert good.prompt_logprobs_tensors is not None and len(good.prompt_logprobs_tensors) == 36
    assert not engine.has_unfinished_requests()
