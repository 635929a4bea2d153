"""One bad request fails alone: admission refuses bad token ids; what escapes validation
finishes that request with finish_reason "error" while every other request gets the tokens of
a clean run; a failed forward fails only its step, and the engine serves the next call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench import LLM, SamplingParams
from workbench.core.sched import utils as stop_module

from .conftest import mixed_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def vocab(checkpoints: dict[str, Path]) -> int:
    return int(json.loads((checkpoints["llama"] / "config.json").read_text())["vocab_size"])


def _llm(checkpoints: dict[str, Path], **kw: Any) -> LLM:
    return LLM(checkpoints["llama"], dtype="float32", max_model_len=128, block_size=4, **kw)


@pytest.fixture(scope="module")
def llm(checkpoints: dict[str, Path]) -> LLM:
    return _llm(checkpoints)


@pytest.fixture(scope="module")
def prompts(vocab: int) -> list[list[int]]:
    return mixed_prompts(vocab)[:6]


@pytest.fixture(scope="module")
def clean(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def _assert_idle(llm: LLM) -> None:
    engine = llm.engine
    assert engine.scheduler.requests == {}
    assert engine.scheduler.running == [] and len(engine.scheduler.waiting) == 0
    assert engine.scheduler.kv_cache_manager.usage == 0.0
    engine.scheduler.kv_cache_manager.check_integrity()


def _sabotage(params: SamplingParams, vocab: int) -> SamplingParams:
    """Params broken behind validation's back: a stop id past the vocabulary with
    min_tokens > 0 makes the sampler's ban raise (issue 15's IndexError)."""
    params.stop_token_ids = [vocab + 7]
    return params


@pytest.fixture
def validation_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission's vocabulary check switched off: what validation misses reaches the step."""
    monkeypatch.setattr(SamplingParams, "check_token_ids", lambda self, vocab_size: None)


# ---------------------------------------------------------------------------- admission
def test_out_of_vocab_stop_token_ids_are_refused_at_admission(llm: LLM, vocab: int) -> None:
    """Issue 15's case: it used to raise IndexError inside the step and poison the engine."""
    bad = SamplingParams(temperature=0.0, max_tokens=4, min_tokens=2, stop_token_ids=[vocab])
    with pytest.raises(ValueError, match=(
        rf"^prompts\[1\]: stop_token_ids\[0\] \({vocab}\) is out of range; allowed "
        rf"0\.\.{vocab - 1} \(the model's vocabulary\)$"
    )):
        llm.generate([[11, 12], [13, 14]], [GREEDY, bad])
    _assert_idle(llm)  # nothing was enqueued


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": float("inf")}, r"temperature \(inf\) must be a finite number >= 0"),
    ({"temperature": float("nan")}, r"temperature \(nan\) must be a finite number >= 0"),
    ({"top_p": float("nan")}, r"top_p \(nan\) must be a number in \(0, 1\]"),
    ({"temperature": "0.5"}, r"temperature \('0.5'\) must be a finite number"),
    ({"n": True}, r"n \(True\) must be an integer >= 1"),
    ({"max_tokens": 2.0}, r"max_tokens \(2.0\) must be an integer >= 1"),
    ({"stop_token_ids": [3, -1]}, r"stop_token_ids\[1\] \(-1\) must be a token id"),
    ({"stop_token_ids": ["3"]}, r"stop_token_ids\[0\] \('3'\) must be a token id"),
    ({"stop_token_ids": 3}, r"stop_token_ids \(3\) must be a list of token ids"),
    ({"ignore_eos": 1}, r"ignore_eos \(1\) must be true or false"),
    ({"seed": 2**64 - 1, "n": 2}, r"seed \(18446744073709551615\) must be an integer in"),
    ({"top_k": -2}, r"top_k \(-2\) must be -1, 0 \(disabled\) or a positive int"),
])
def test_sampling_params_refuse_every_bad_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(("prompt", "message"), [
    ([11, 2.5], r"prompt_token_ids\[1\] \(2.5\) must be an integer token id"),
    ([11, "12"], r"prompt_token_ids\[1\] \('12'\) must be an integer token id"),
    ({"prompt_token_ids": [11, -3]}, r"prompt_token_ids\[1\] \(-3\) is out of range"),
    ({"prompt_token_ids": 5}, r"prompt_token_ids \(5\) must be a list of token ids"),
])
def test_prompt_token_ids_are_checked_one_by_one(llm: LLM, prompt: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.engine.make_request(prompt, GREEDY)


def test_n_above_max_num_seqs_is_refused(checkpoints: dict[str, Path]) -> None:
    small = _llm(checkpoints, max_num_seqs=4)
    with pytest.raises(ValueError, match=r"n \(5\) must be <= max_num_seqs \(4\)"):
        small.generate([[11, 12]], SamplingParams(n=5, temperature=1.0, max_tokens=2))


def test_request_fields_beside_sampling_params_are_checked(llm: LLM) -> None:
    engine = llm.engine
    with pytest.raises(ValueError, match=r"priority \('1'\) must be an integer"):
        engine.make_request([11], GREEDY, priority="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cache_salt \(5\) must be a string or None"):
        engine.make_request([11], GREEDY, cache_salt=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"arrival_time \(nan\) must be a finite number"):
        engine.make_request([11], GREEDY, arrival_time=float("nan"))


# ---------------------------------------------------------------------- request failures
def test_a_request_failing_in_sampling_fails_alone(
    llm: LLM, prompts: list[list[int]], clean: list[list[int]], vocab: int
, validation_gap: None) -> None:
    bad = _sabotage(SamplingParams(temperature=0.0, max_tokens=10, min_tokens=3), vocab)
    params = [GREEDY] * len(prompts)
    params[2] = bad
    before = llm.stats()["request_success_by_reason"]["error"]
    outs = llm.generate(prompts, params)
    failed = outs[2].outputs[0]
    assert failed.finish_reason == "error" and failed.token_ids == []
    assert failed.error is not None and failed.error.startswith("sampling failed: IndexError")
    for i, o in enumerate(outs):
        if i != 2:
            assert o.outputs[0].finish_reason == "length"
            assert o.outputs[0].token_ids == clean[i], f"request {i} changed"
    assert llm.stats()["request_success_by_reason"]["error"] == before + 1
    assert llm.errors()[-1]["scope"] == "request"  # the public read-out
    _assert_idle(llm)
    # the engine is not poisoned: the same batch without the bad request is the clean run
    again = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == clean


def test_sampled_bystanders_keep_their_seeded_tokens(
    llm: LLM, prompts: list[list[int]], vocab: int
, validation_gap: None) -> None:
    seeded = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=100 + i, max_tokens=8,
                             ignore_eos=True) for i in range(len(prompts))]
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, seeded)]
    mixed = list(seeded)
    mixed[1] = _sabotage(SamplingParams(temperature=0.8, seed=5, max_tokens=8, min_tokens=2),
                         vocab)
    outs = llm.generate(prompts, mixed)
    assert outs[1].outputs[0].finish_reason == "error"
    for i, o in enumerate(outs):
        if i != 1:
            assert o.outputs[0].token_ids == ref[i], f"request {i} changed"
    _assert_idle(llm)


def test_a_failing_request_mid_decode_keeps_its_tokens_and_frees_its_blocks(
    llm: LLM, prompts: list[list[int]], clean: list[list[int]], vocab: int
) -> None:
    """min_tokens=5: the ban (and so the failure) happens at every step before the fifth
    token; sabotaging the stop ids only after the prefill makes it fail at output 1."""
    engine = llm.engine
    bad = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=5)
    reqs = [engine.make_request(p, GREEDY if i else bad, request_id=f"m{i}")
            for i, p in enumerate(prompts)]
    for r in reqs:
        engine.add_request(r)
    while reqs[0].num_output_tokens == 0:
        engine.step()
    _sabotage(bad, vocab)
    while engine.has_unfinished_requests():
        engine.step()
    assert reqs[0].status.finish_reason == "error"
    assert reqs[0].output_token_ids == clean[0][:1]  # what it had before failing
    assert [r.output_token_ids for r in reqs[1:]] == clean[1:]
    _assert_idle(llm)


def test_a_request_failing_in_its_update_fails_alone(
    llm: LLM, prompts: list[list[int]], clean: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = stop_module.check_stop
    victim = prompts[3]

    def check_stop(req: Any, max_model_len: int) -> bool:
        if req.prompt_token_ids == victim and req.num_output_tokens == 4:
            raise KeyError("injected update failure")
        return real(req, max_model_len)

    monkeypatch.setattr("workbench.core.sched.scheduler.check_stop", check_stop)
    outs = llm.generate(prompts, GREEDY)
    assert outs[3].outputs[0].finish_reason == "error"
    assert outs[3].outputs[0].error == "update failed: KeyError: 'injected update failure'"
    assert outs[3].outputs[0].token_ids == clean[3][:4]
    assert [o.outputs[0].token_ids for i, o in enumerate(outs) if i != 3] == [
        c for i, c in enumerate(clean) if i != 3]
    _assert_idle(llm)


def test_one_failing_child_of_n_fails_alone(llm: LLM, vocab: int) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    ref = llm.generate([[11, 12, 13, 14, 15]], params)[0].outputs
    engine = llm.engine
    req = engine.make_request([11, 12, 13, 14, 15], params, request_id="fam")
    engine.add_request(req)
    engine.step()  # the prefill: the parent forks children #1 and #2
    child = engine.scheduler.requests["fam#1"]
    child.sampling_params.min_tokens = 3
    _sabotage(child.sampling_params, vocab)
    done: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for r in engine.step():
            if r.is_finished():
                done[r.request_id] = r
    assert done["fam#1"].status.finish_reason == "error"
    assert done["fam"].output_token_ids == ref[0].token_ids
    assert done["fam#2"].output_token_ids == ref[2].token_ids
    _assert_idle(llm)


# ---------------------------------------------------------------------- step failures
def _failing_forward(engine: Any, monkeypatch: pytest.MonkeyPatch, fails: Any) -> dict[str, int]:
    """Make the model forward raise when `fails(call number, input_ids)` says so."""
    real = engine.runner.forward
    calls = {"n": 0}

    def forward(input_ids: Any, *args: Any) -> Any:
        calls["n"] += 1
        if fails(calls["n"], input_ids):
            raise RuntimeError("injected forward failure")
        return real(input_ids, *args)

    monkeypatch.setattr(engine.runner, "forward", forward)
    return calls


def _unused_token(prompts: list[list[int]], vocab: int) -> int:
    used = {t for p in prompts for t in p}
    return next(t for t in range(10, vocab) if t not in used)


def test_a_forward_failing_on_every_try_fails_its_step_and_drops_unwritten_cache_keys(
    checkpoints: dict[str, Path], prompts: list[list[int]], clean: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = _llm(checkpoints)
    engine = llm.engine
    pool = engine.scheduler.kv_cache_manager.block_pool
    # request a decodes first (its 70-token prompt is cached: 17 full blocks of 4)
    a = engine.make_request(prompts[1], GREEDY, request_id="a")
    engine.add_request(a)
    engine.step()
    assert len(pool.cached_block_hash_to_block) == 17
    # the batched try and both one-by-one tries fail: nobody can be blamed
    calls = _failing_forward(engine, monkeypatch, lambda n, ids: n <= 3)
    b = engine.make_request(prompts[3], GREEDY, request_id="b")  # 33 tokens: 8 full blocks
    engine.add_request(b)
    progressed = engine.step()  # a's decode and b's prefill fail together
    assert calls["n"] == 3
    assert {r.request_id for r in progressed} == {"a", "b"}
    assert a.status.finish_reason == b.status.finish_reason == "error"
    assert a.error == "engine step failed: RuntimeError: injected forward failure"
    assert a.output_token_ids == clean[1][:1]
    assert engine.errors[-1]["scope"] == "step"
    assert engine.errors[-1]["request_ids"] == ["a", "b"]
    # a's prompt blocks were written by earlier steps: still cached; b's prefill never was
    assert len(pool.cached_block_hash_to_block) == 17
    _assert_idle(llm)
    # b's prompt is computed from scratch (no hit on unwritten KV) and gives the clean tokens
    outs = llm.generate([prompts[3], prompts[1]], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == [clean[3], clean[1]]
    assert outs[0].num_cached_tokens == 0
    assert outs[1].num_cached_tokens == 68  # a's 17 full prompt blocks
    _assert_idle(llm)


def test_a_forward_failure_one_request_causes_fails_that_request_alone(
    checkpoints: dict[str, Path], prompts: list[list[int]], clean: list[list[int]],
    vocab: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever validation misses may only break the batched forward (here: a token id the
    'model' cannot take). Running the step's requests one by one finds the culprit."""
    llm = _llm(checkpoints)
    engine = llm.engine
    poison = _unused_token(prompts, vocab)
    calls = _failing_forward(engine, monkeypatch, lambda n, ids: bool((ids == poison).any()))
    bad = prompts[2][:5] + [poison] + prompts[2][5:]
    batch = [prompts[0], prompts[1], bad, prompts[3], prompts[4]]
    outs = llm.generate(batch, GREEDY)
    assert calls["n"] > 1
    assert outs[2].outputs[0].finish_reason == "error"
    assert outs[2].outputs[0].error == "engine step failed: RuntimeError: injected forward failure"
    assert [o.outputs[0].token_ids for i, o in enumerate(outs) if i != 2] == [
        clean[0], clean[1], clean[3], clean[4]]
    assert engine.errors[-1]["scope"] == "request"
    assert not any(b.block_hash is not None and b.token_ids and poison in b.token_ids
                   for b in engine.scheduler.kv_cache_manager.block_pool.blocks)
    _assert_idle(llm)


def test_a_request_hitting_blocks_a_failed_request_was_writing_fails_too(
    checkpoints: dict[str, Path], prompts: list[list[int]], vocab: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """b and c start in the same step and c's prompt begins with b's first 32 tokens: c hits
    the 8 blocks b is computing. b fails in the forward, so those blocks may be unwritten:
    c must not decode from them (it fails, and a rerun gives its clean tokens)."""
    llm = _llm(checkpoints)
    engine = llm.engine
    poison = _unused_token(prompts, vocab)
    b_prompt = prompts[1][:32] + [poison] + prompts[1][32:40]
    c_prompt = prompts[1][:32] + prompts[5][:9]
    clean_c = llm.generate([c_prompt], GREEDY)[0].outputs[0].token_ids
    engine.reset_prefix_cache()
    _failing_forward(engine, monkeypatch, lambda n, ids: bool((ids == poison).any()))
    outs = llm.generate([b_prompt, c_prompt, prompts[4]], GREEDY)
    assert outs[1].num_cached_tokens == 32  # the same-step hit on b's blocks
    assert [o.outputs[0].finish_reason for o in outs] == ["error", "error", "length"]
    assert outs[1].outputs[0].error == (
        "engine step failed: it reads prefix-cache blocks that failed request(s) "
        f"['{outs[0].request_id}'] did not write")
    _assert_idle(llm)
    again = llm.generate([c_prompt], GREEDY)[0]
    assert again.outputs[0].token_ids == clean_c and again.num_cached_tokens == 0


def test_a_scheduler_bug_in_generate_leaves_the_engine_usable(
    checkpoints: dict[str, Path], prompts: list[list[int]], clean: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = _llm(checkpoints)
    real = llm.engine.scheduler.schedule
    calls = {"n": 0}

    def schedule() -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected scheduler bug")
        return real()

    monkeypatch.setattr(llm.engine.scheduler, "schedule", schedule)
    with pytest.raises(RuntimeError, match="injected scheduler bug"):
        llm.generate(prompts, GREEDY)
    _assert_idle(llm)  # the failed call's requests were taken out
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == clean


def test_a_failing_proposer_costs_only_drafts(
    checkpoints: dict[str, Path], prompts: list[list[int]], clean: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm = _llm(checkpoints, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    proposer = llm.engine.runner.drafter
    assert proposer is not None
    real = proposer.propose
    calls = {"n": 0}

    def propose(*args: Any) -> Any:
        calls["n"] += 1
        drafts = real(*args)  # drafts are made, then the proposer fails: they must be dropped
        if calls["n"] in (2, 3):
            raise RuntimeError("injected proposer failure")
        return drafts

    monkeypatch.setattr(proposer, "propose", propose)
    outs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == clean
    assert [e["scope"] for e in llm.engine.errors] == ["propose", "propose"]
    _assert_idle(llm)


@pytest.mark.parametrize("how", ["max_tokens", "stop_token"])
def test_n_siblings_all_finish_when_each_ends_on_its_first_token(
    llm: LLM, how: str
) -> None:
    """Found by the server's fuzzer (when siblings were forked after the first token): a
    parent ending on its first token left the request waiting for n sequences forever."""
    prompt = [11, 12, 13, 14, 15, 16]
    first = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))[0]
    tok = first.outputs[0].token_ids[0]
    kw: dict[str, Any] = ({"max_tokens": 1} if how == "max_tokens"
                          else {"max_tokens": 4, "stop_token_ids": [tok]})
    outs = llm.generate([prompt], SamplingParams(n=3, temperature=0.0, **kw))[0].outputs
    assert [o.index for o in outs] == [0, 1, 2]
    # greedy: every child samples the same first token, and it ends each of them
    assert [o.token_ids for o in outs] == [[tok]] * 3
    reason = "length" if how == "max_tokens" else "stop"
    assert [o.finish_reason for o in outs] == [reason] * 3
    _assert_idle(llm)
