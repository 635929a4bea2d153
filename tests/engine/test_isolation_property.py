"""Property: any mix of valid, invalid and validation-escaping requests leaves the valid ones'
tokens equal to a clean run and the engine idle and usable (issue 15, part 1 (a)).

Per example: 1-6 requests. An invalid one (a bad field drawn from INVALID) must be refused by
admission with a ValueError naming that field; a valid one is enqueued; an "escaping" one is
valid at admission and broken afterwards (a stop id past the vocabulary with min_tokens > 0,
which raises inside the sampler) and must finish alone with finish_reason "error"; a
"poison" one gets a token id past the vocabulary after admission, which breaks the batched
forward (the embedding raises): the engine must find it by running the step's requests one by
one and fail it alone. The valid requests' tokens must equal what each gives alone (greedy,
or sampled with its own seed); a valid request may fail only for reading prefix-cache blocks
a poisoned request was writing in the same step (its prompt then shares a block with it).
Example counts come from the hypothesis profile (HYPOTHESIS_PROFILE=ci|long).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import LLM, SamplingParams
from workbench.core.request import Request

MAX_MODEL_LEN = 64


@pytest.fixture(scope="module")
def llm(checkpoints: dict[str, Path]) -> LLM:
    return LLM(checkpoints["llama"], dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=4,
               max_num_seqs=8, num_gpu_blocks_override=64)


@pytest.fixture(scope="module")
def vocab(checkpoints: dict[str, Path]) -> int:
    return int(json.loads((checkpoints["llama"] / "config.json").read_text())["vocab_size"])


# field -> bad values; `V` stands for the vocabulary size, filled in per test
INVALID: dict[str, list[Any]] = {
    "temperature": [float("inf"), float("-inf"), float("nan"), -0.5, "hot", None],
    "top_p": [0.0, 1.5, float("nan"), float("inf")],
    "top_k": [-2, 1.5, True],
    "max_tokens": [0, -3, 2.5, "8"],
    "min_tokens": [-1, 99],  # 99 > max_tokens
    "n": [0, True, 1.0],
    "seed": [1.5, "7", 2**64],
    "stop_token_ids": [["V"], [-1], ["x"], 5, [True]],
    "ignore_eos": [1, "yes"],
    "prompt_token_ids": [["V"], [-1], [], [1.5], ["long"]],
}


@st.composite
def request_spec(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["valid", "valid", "valid", "invalid", "escaping", "poison"]))
    prompt = draw(st.lists(st.integers(3, 1000), min_size=1, max_size=40))
    greedy = draw(st.booleans())
    kwargs: dict[str, Any] = {
        "max_tokens": draw(st.integers(1, 8)),
        "ignore_eos": True,
        "temperature": 0.0 if greedy else draw(st.sampled_from([0.5, 1.0, 1.3])),
        "seed": None if greedy else draw(st.integers(0, 2**31)),
    }
    if not greedy:
        kwargs["top_p"] = draw(st.sampled_from([1.0, 0.9, 0.5]))
        kwargs["top_k"] = draw(st.sampled_from([0, -1, 5, 50]))
    if draw(st.booleans()):
        kwargs["stop_token_ids"] = draw(st.lists(st.integers(0, 1023), max_size=3))
        kwargs["min_tokens"] = draw(st.integers(0, kwargs["max_tokens"]))
    field = value = None
    if kind == "invalid":
        field = draw(st.sampled_from(sorted(INVALID)))
        value = draw(st.sampled_from(INVALID[field]))
    if kind == "escaping":
        kwargs["max_tokens"] = max(kwargs["max_tokens"], 2)
        kwargs["min_tokens"] = draw(st.integers(1, kwargs["max_tokens"]))
    return {"kind": kind, "prompt": prompt, "kwargs": kwargs, "field": field, "value": value}


def _fill(value: Any, vocab: int) -> Any:
    if value == "V":
        return vocab
    if value == "long":
        return [5] * (MAX_MODEL_LEN + 1)
    if isinstance(value, list):
        return [_fill(v, vocab) for v in value]
    return value


def _admit(llm: LLM, spec: dict[str, Any], vocab: int, rid: str) -> Request:
    kwargs = dict(spec["kwargs"])
    prompt = spec["prompt"]
    if spec["field"] == "prompt_token_ids":
        bad = _fill(spec["value"], vocab)
        prompt = bad if spec["value"] in ([], ["long"]) else prompt + bad
    elif spec["field"] is not None:
        kwargs[spec["field"]] = _fill(spec["value"], vocab)
    return llm.engine.make_request(prompt, SamplingParams(**kwargs), request_id=rid)


def _run(llm: LLM, requests: list[Request]) -> None:
    engine = llm.engine
    for r in requests:
        engine.add_request(r)
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    raise AssertionError("the engine did not finish the requests")


_alone: dict[tuple[Any, ...], list[int]] = {}


def _tokens_alone(llm: LLM, spec: dict[str, Any]) -> list[int]:
    """The request's tokens when it runs by itself (cached across examples)."""
    key = (tuple(spec["prompt"]), tuple(sorted((k, str(v)) for k, v in spec["kwargs"].items())))
    if key not in _alone:
        req = llm.engine.make_request(spec["prompt"], SamplingParams(**spec["kwargs"]),
                                      request_id="alone")
        _run(llm, [req])
        _alone[key] = list(req.output_token_ids)
    return _alone[key]


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                HealthCheck.too_slow])
@given(specs=st.lists(request_spec(), min_size=1, max_size=6))
def test_valid_requests_are_untouched_by_invalid_and_failing_ones(
    llm: LLM, vocab: int, specs: list[dict[str, Any]]
) -> None:
    engine = llm.engine
    admitted: list[tuple[dict[str, Any], Request]] = []
    for i, spec in enumerate(specs):
        try:
            req = _admit(llm, spec, vocab, f"r{i}")
        except ValueError as e:
            assert spec["kind"] == "invalid", f"a valid request was refused: {e}"
            name = "prompt" if spec["field"] == "prompt_token_ids" else spec["field"]
            assert name in str(e), f"the error does not name {name!r}: {e}"
            continue
        assert spec["kind"] != "invalid", f"{spec['field']}={spec['value']!r} was accepted"
        if spec["kind"] == "escaping":
            req.sampling_params.stop_token_ids = [vocab + 11]
        if spec["kind"] == "poison":
            req.prompt_token_ids[-1] = req.all_token_ids[-1] = vocab + 3
        admitted.append((spec, req))
    _run(llm, [req for _, req in admitted])
    poisoned = [req for spec, req in admitted if spec["kind"] == "poison"]
    for spec, req in admitted:
        if spec["kind"] in ("escaping", "poison"):
            assert req.status.finish_reason == "error"
            assert req.error is not None
            assert "IndexError" in req.error or "did not write" in req.error, req.error
        elif req.status.finish_reason == "error":
            assert req.error is not None and "did not write" in req.error, req.error
            assert any(p.prompt_token_ids[:4] == req.prompt_token_ids[:4] for p in poisoned)
            spec["kind"] = "collateral"
        else:
            assert req.status.finish_reason in ("length", "stop"), req.error
    # the engine is idle: every block back, no request left behind
    assert engine.scheduler.requests == {}
    assert engine.scheduler.kv_cache_manager.usage == 0.0
    engine.scheduler.kv_cache_manager.check_integrity()
    for spec, req in admitted:
        if spec["kind"] == "valid":
            assert req.output_token_ids == _tokens_alone(llm, spec)
