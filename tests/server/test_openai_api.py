"""The real `openai` client (sync and async) against the server: completions, chat, streaming,
usage, stop strings/tokens, n and batches, request ids, 32 concurrent streams."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import ENGINE_KW, MODEL_NAME, ServerHandle, make_app, start_server
from tests.server.conftest import stop_server as _stop
from workbench import LLM, SamplingParams
from workbench.entrypoints.openai.protocol.prompts import chat_prompt, default_chat_template
from workbench.entrypoints.openai.protocol.requests import ChatCompletionRequest
from workbench.models.tokenizer import load_tokenizer

PROMPT = "The paged KV cache stores keys and values in fixed-size blocks"
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


def _client(s: ServerHandle, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0, **kw)


def _aclient(s: ServerHandle) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0,
                              timeout=120)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> dict[str, Any]:
    """Greedy outputs of the offline LLM with the server's engine knobs."""
    llm = LLM(model_dir, **ENGINE_KW)
    tok = llm.get_tokenizer()
    ids = list(tok(PROMPT)["input_ids"])
    out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    return {"prompt_ids": ids, "token_ids": out[0].outputs[0].token_ids,
            "text": out[0].outputs[0].text, "tok": tok}


def test_models_health_and_reset(idle_server: ServerHandle) -> None:
    models = _client(idle_server).models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert models.data[0].model_extra["max_model_len"] == ENGINE_KW["max_model_len"]
    assert httpx.get(f"{idle_server.base_url}/health").status_code == 200
    r = httpx.post(f"{idle_server.base_url}/reset_prefix_cache")
    assert r.status_code == 200 and r.json() == {"success": True}


def test_completion_matches_offline_engine(idle_server: ServerHandle, reference: dict) -> None:
    raw = _client(idle_server).completions.with_raw_response.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=24, **GREEDY)
    c = raw.parse()
    assert raw.headers["x-request-id"] == c.id and c.id.startswith("cmpl-")
    assert c.object == "text_completion" and c.model == MODEL_NAME
    assert c.choices[0].text == reference["text"]
    assert c.choices[0].finish_reason == "length"
    assert c.usage.prompt_tokens == len(reference["prompt_ids"])
    assert c.usage.completion_tokens == 24 and c.usage.total_tokens == c.usage.prompt_tokens + 24
    m = c.model_extra["metrics"]
    assert m["queue_time_ms"] >= 0 and m["time_to_first_token_ms"] > 0
    assert m["arrival_to_first_token_ms"] >= m["time_to_first_token_ms"]
    assert m["num_output_tokens"] == 24 and m["mean_itl_ms"] > 0


def test_streamed_completion_equals_non_streamed(idle_server: ServerHandle,
                                                 reference: dict) -> None:
    stream = _client(idle_server).completions.create(
        model=MODEL_NAME, prompt=reference["prompt_ids"], max_tokens=24, stream=True,
        stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == reference["text"]
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 24
    assert last.usage.prompt_tokens == len(reference["prompt_ids"])
    assert last.model_extra["metrics"]["time_to_first_token_ms"] > 0
    assert all(ch.usage is None for ch in chunks[:-1])


def test_stream_return_token_ids(idle_server: ServerHandle, reference: dict) -> None:
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    ids: list[int] = []
    with httpx.stream("POST", f"{idle_server.base_url}/v1/completions", json=body) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json

    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    for ch in chunks:
        ids.extend(ch["choices"][0]["token_ids"])
    assert ids == reference["token_ids"]
    assert "metrics" in chunks[-1] and "metrics" not in chunks[0]


def test_chat_sync_and_stream(idle_server: ServerHandle) -> None:
    client = _client(idle_server)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is TTFT?"}]}]
    c = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12,
                                       **GREEDY)
    assert c.object == "chat.completion" and c.id.startswith("chatcmpl-")
    assert c.choices[0].message.role == "assistant" and c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_completion_tokens=12, stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == c.usage.prompt_tokens


def test_default_chat_template_when_checkpoint_has_none(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    tok.chat_template = None
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}]})
    engine = SimpleNamespace(tokenizer=tok, max_model_len=4096)
    ids = chat_prompt(engine, req)  # type: ignore[arg-type]
    text = default_chat_template([{"role": "user", "content": "hi"}], True, tok.bos_token)
    assert text == f"{tok.bos_token}user: hi\nassistant: "
    assert ids == list(tok(text, add_special_tokens=False)["input_ids"])


def test_stop_string_and_stop_token(idle_server: ServerHandle, reference: dict) -> None:
    client = _client(idle_server)
    full = reference["text"]
    stop = full[len(full) // 2: len(full) // 2 + 3]
    expect = full[:full.index(stop)]
    c = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, stop=[stop],
                                  **GREEDY)
    assert c.choices[0].text == expect and c.choices[0].finish_reason == "stop"
    assert c.choices[0].model_extra["stop_reason"] == stop
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24,
                                            stop=stop, stream=True, **GREEDY))
    assert "".join(ch.choices[0].text for ch in chunks) == expect
    assert chunks[-1].choices[0].finish_reason == "stop"
    token = reference["token_ids"][5]
    first = reference["token_ids"].index(token)
    c = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, **{
        **GREEDY, "extra_body": {"ignore_eos": True, "stop_token_ids": [token]}})
    assert c.choices[0].finish_reason == "stop"
    assert c.choices[0].model_extra["stop_reason"] == token
    assert c.usage.completion_tokens == first + 1


def test_batch_prompts_and_n(idle_server: ServerHandle, reference: dict) -> None:
    client = _client(idle_server)
    ids = reference["prompt_ids"]
    c = client.completions.create(model=MODEL_NAME, prompt=[ids, ids[:5]], n=2, max_tokens=6,
                                  temperature=0.8, seed=3, extra_body={"ignore_eos": True})
    assert [ch.index for ch in c.choices] == [0, 1, 2, 3]
    assert c.usage.prompt_tokens == len(ids) + 5 and c.usage.completion_tokens == 24
    assert c.model_extra["metrics"] is None  # several sequences: not attributable (as vLLM)
    c = client.completions.create(model=MODEL_NAME, prompt=["a b c", "d e f"], max_tokens=3,
                                  **GREEDY)
    assert len(c.choices) == 2 and all(ch.finish_reason == "length" for ch in c.choices)


def test_client_request_id_is_echoed(idle_server: ServerHandle) -> None:
    client = _client(idle_server, default_headers={"x-request-id": "bench-000042"})
    raw = client.completions.with_raw_response.create(model=MODEL_NAME, prompt="hi",
                                                      max_tokens=2, **GREEDY)
    assert raw.headers["x-request-id"] == "bench-000042"
    assert raw.parse().id == "bench-000042"


def test_32_concurrent_async_streams(idle_server: ServerHandle, reference: dict) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
        stream = await client.completions.create(
            model=MODEL_NAME, prompt=reference["prompt_ids"] if i % 2 == 0 else f"{i} {PROMPT}",
            max_tokens=24, stream=True, stream_options={"include_usage": True}, **GREEDY)
        text, usage = "", -1
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].text
            if ch.usage is not None:
                usage = ch.usage.completion_tokens
        return text, usage

    async def main() -> list[tuple[str, int]]:
        async with _aclient(idle_server) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(main())
    assert all(u == 24 for _, u in results)
    assert all(text == reference["text"] for text, _ in results[::2])  # batching is exact


def test_api_key(model_dir: Path) -> None:
    handle = start_server(make_app(model_dir, api_key="sekret"))
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            _client(handle).models.list()
        assert e.value.status_code == 401 and e.value.body["type"] == "AuthenticationError"
        ok = openai.OpenAI(base_url=f"{handle.base_url}/v1", api_key="sekret", max_retries=0)
        assert ok.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).usage
        assert httpx.get(f"{handle.base_url}/health").status_code == 200
        assert httpx.get(f"{handle.base_url}/metrics").status_code == 200
    finally:
        _stop(handle)


def test_n_choices_when_every_sequence_ends_on_its_first_token(model_dir: Path) -> None:
    handle = start_server(make_app(model_dir))  # its own server: a hang must not leak
    try:
        for body in ({"max_tokens": 1}, {"max_tokens": 1, "stream": True}):
            r = httpx.post(f"{handle.base_url}/v1/completions", timeout=15,
                           json={"prompt": "hi", "n": 3, **body})
            assert r.status_code == 200
            if body.get("stream"):
                finishes = [line for line in r.text.splitlines() if '"length"' in line]
                assert len(finishes) == 3 and r.text.rstrip().endswith("data: [DONE]")
            else:
                choices = r.json()["choices"]
                assert [c["index"] for c in choices] == [0, 1, 2]
                assert {c["finish_reason"] for c in choices} == {"length"}
                assert r.json()["usage"]["completion_tokens"] == 3
    finally:
        _stop(handle)
