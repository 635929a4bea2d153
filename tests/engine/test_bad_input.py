"""Bad input gets one clear ValueError naming the field; other requests are unaffected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from workbench import LLM, SamplingParams

from .conftest import NUM_OUTPUT

GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(checkpoints: dict[str, Path]) -> LLM:
    return LLM(checkpoints["llama"], dtype="float32", max_model_len=128, block_size=4)


def test_prompt_longer_than_max_model_len(llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"prompts\[1\]: prompt \(length 129\) is longer than "
                                         r"max_model_len \(128\)"):
        llm.generate([[11, 12], [11] * 129], GREEDY)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, r"max_tokens \(0\) must be an integer >= 1"),
        ({"temperature": -0.5}, r"temperature \(-0.5\) must be >= 0"),
        ({"top_p": 0.0}, r"top_p \(0.0\) must be in \(0, 1\]"),
        ({"n": 0}, r"n \(0\) must be an integer >= 1"),
        ({"min_tokens": 5, "max_tokens": 2}, r"min_tokens \(5\) must be <= max_tokens \(2\)"),
    ],
)
def test_bad_sampling_params(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_pool_too_small_for_one_max_model_len_request(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"has 9 usable blocks \(36 tokens.*max_model_len \(128\)"
                                         r" needs \(32 blocks\)"):
        LLM(checkpoints["llama"], dtype="float32", max_model_len=128, block_size=4,
            num_gpu_blocks_override=10)


def test_missing_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model \('.*nope'\) is not a folder"):
        LLM(tmp_path / "nope")


def test_unsupported_architecture_lists_supported(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "gpt2ish"
    shutil.copytree(checkpoints["llama"], path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"'GPT2LMHeadModel'.*LlamaForCausalLM, "
                                         r"Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM"):
        LLM(path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_batched_tokens": 8, "max_num_seqs": 16},
         r"max_num_batched_tokens \(8\) must be >= max_num_seqs \(16\)"),
        ({"block_size": 3}, r"block_size \(3\) must be one of"),
        ({"dtype": "int8"}, r"dtype \('int8'\) must be one of"),
        ({"max_model_len": 10**6}, r"max_model_len \(1000000\) must be <= the model's"),
        ({"not_a_knob": 1}, r"unknown engine argument\(s\) not_a_knob"),
    ],
)
def test_bad_engine_config(
    checkpoints: dict[str, Path], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LLM(checkpoints["llama"], **kwargs)


def test_bad_requests_leave_in_flight_requests_untouched(
    llm: LLM, references: dict[str, Any]
) -> None:
    prompts, expected = references["llama"]
    engine = llm.engine
    reqs = [engine.make_request(p, GREEDY) for p in prompts]
    for r in reqs:
        engine.add_request(r)
    engine.step()
    engine.step()
    bad_inputs: list[tuple[Any, str]] = [
        ([11] * 200, "max_model_len"),
        ([], "prompt is empty"),
        ([10**9], "out of range"),
        ({"nothing": 1}, "must include 'prompt' or 'prompt_token_ids'"),
        (3.5, "not allowed"),
    ]
    for bad, msg in bad_inputs:
        with pytest.raises(ValueError, match=msg):
            engine.make_request(bad, GREEDY)
    with pytest.raises(ValueError, match="already in the engine"):
        engine.add_request(engine.make_request(prompts[0], GREEDY, request_id=reqs[0].request_id))
    while engine.has_unfinished_requests():
        engine.step()
    assert [r.output_token_ids for r in reqs] == expected
    # And a generate() whose batch holds a bad prompt enqueues nothing; the next one works.
    with pytest.raises(ValueError, match=r"prompts\[2\]"):
        llm.generate([prompts[0], prompts[1], [11] * 500], GREEDY)
    assert not engine.has_unfinished_requests()
    outs = llm.generate(prompts[:2], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected[:2]
