"""The mock OpenAI server's responses, exactly: chunk counts = max_tokens, usage numbers, vLLM's
chunk shapes, read back with the harness's own SSE parser; the refusals; the program's
start and SIGTERM stop. No timing is checked."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from workbench.bench.mock_openai.generation import MockConfig
from workbench.bench.mock_openai.serve import pin_to_cpus, serve_in_thread
from workbench.bench.mock_openai.server import MockServer
from workbench.entrypoints.openai.protocol.sse import SSEDecoder
from workbench.harness.metrics import RequestRecord
from workbench.harness.sse import StreamParser


@pytest.fixture(scope="module")
def mock() -> Iterator[tuple[MockServer, httpx.Client]]:
    with serve_in_thread(MockConfig(port=0, eos_after=3)) as server, httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}", trust_env=False, timeout=30) as client:
        yield server, client


def _stream(client: httpx.Client, path: str, body: dict[str, Any],
            headers: dict[str, str] | None = None) -> tuple[list[str], httpx.Response]:
    resp = client.post(path, json={"stream": True, **body}, headers=headers or {})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    dec = SSEDecoder()
    return dec.feed(resp.content) + dec.flush(), resp


def _parse(payloads: list[str], chat: bool = False) -> tuple[RequestRecord, dict[str, Any]]:
    rec = RequestRecord("r", 0, 0, False)
    parser = StreamParser(rec, chat=chat)
    for i, data in enumerate(payloads):
        parser.feed(data, float(i))
    parser.finish(float(len(payloads)))
    return rec, parser.info


def test_completions_stream_is_vllms_shape(mock: tuple[MockServer, httpx.Client]) -> None:
    _, client = mock
    payloads, resp = _stream(client, "/v1/completions", {
        "model": "mock", "prompt": [5, 6, 7, 8], "max_tokens": 5, "ignore_eos": True,
        "stream_options": {"include_usage": True}}, headers={"x-request-id": "req-1"})
    assert resp.headers["x-request-id"] == "req-1"
    assert payloads[-1] == "[DONE]" and len(payloads) == 5 + 2
    events = [json.loads(p) for p in payloads[:-1]]
    created = events[0]["created"]
    head = {"id": "cmpl-req-1", "object": "text_completion", "created": created,
            "model": "mock"}
    for i, e in enumerate(events[:5]):
        assert e == {**head, "usage": None, "choices": [{
            "index": 0, "text": f" t{i}", "logprobs": None,
            "finish_reason": "length" if i == 4 else None, "stop_reason": None}]}
    assert events[5] == {**head, "choices": [], "usage": {
        "prompt_tokens": 4, "total_tokens": 9, "completion_tokens": 5}}
    rec, info = _parse(payloads)
    assert rec.success and len(rec.chunk_times_s) == 5 and rec.chunk_tokens == [1] * 5
    assert rec.output_tokens == 5 and rec.prompt_tokens == 4
    assert info["usage"] and info["done"] and info["finish_reason"] == "length"
    assert info["id"] == "cmpl-req-1"


def test_chat_stream_role_chunk_and_continuous_usage(
        mock: tuple[MockServer, httpx.Client]) -> None:
    _, client = mock
    payloads, _ = _stream(client, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "one two three"}]}],
        "max_completion_tokens": 3, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    events = [json.loads(p) for p in payloads[:-1]]
    assert len(events) == 1 + 3 + 1 and payloads[-1] == "[DONE]"
    assert all(e["object"] == "chat.completion.chunk" and e["id"].startswith("chatcmpl-")
               for e in events)
    assert events[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]
    assert [e["choices"][0]["delta"] for e in events[1:4]] == [
        {"content": " t0"}, {"content": " t1"}, {"content": " t2"}]
    assert [e["usage"]["completion_tokens"] for e in events] == [0, 1, 2, 3, 3]
    assert events[4]["choices"] == [] and events[4]["usage"] == {
        "prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
    rec, info = _parse(payloads, chat=True)  # the role chunk is not a token
    assert rec.success and len(rec.chunk_times_s) == 3 and rec.output_tokens == 3
    assert rec.prompt_tokens == 3 and info["finish_reason"] == "length"


def test_no_usage_chunk_unless_asked(mock: tuple[MockServer, httpx.Client]) -> None:
    _, client = mock
    payloads, _ = _stream(client, "/v1/completions", {"prompt": "a b", "max_tokens": 2,
                                                      "ignore_eos": True})
    assert len(payloads) == 2 + 1
    rec, info = _parse(payloads)
    assert rec.output_tokens == 2 and not info["usage"]


def test_eos_unless_ignore_eos(mock: tuple[MockServer, httpx.Client]) -> None:
    _, client = mock  # eos_after=3
    body = {"prompt": [1], "max_tokens": 5, "stream_options": {"include_usage": True}}
    rec, info = _parse(_stream(client, "/v1/completions", body)[0])
    assert rec.output_tokens == 3 and len(rec.chunk_times_s) == 3
    assert info["finish_reason"] == "stop"
    rec, info = _parse(_stream(client, "/v1/completions", {**body, "ignore_eos": True})[0])
    assert rec.output_tokens == 5 and info["finish_reason"] == "length"
    rec, info = _parse(_stream(client, "/v1/completions", {**body, "max_tokens": 2})[0])
    assert rec.output_tokens == 2 and info["finish_reason"] == "length"


def test_non_streaming_bodies(mock: tuple[MockServer, httpx.Client]) -> None:
    _, client = mock
    out = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 3,
                                               "ignore_eos": True}).json()
    assert out["object"] == "text_completion" and out["model"] == "mock"
    assert out["choices"] == [{"index": 0, "text": " t0 t1 t2", "logprobs": None,
                               "finish_reason": "length", "stop_reason": None}]
    assert out["usage"] == {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3}
    out = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2,
        "ignore_eos": True}).json()
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": " t0 t1"}
    assert out["usage"] == {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}
    out = client.post("/v1/completions", json={"prompt": "x", "ignore_eos": True}).json()
    assert out["usage"]["completion_tokens"] == 16  # default_max_tokens


def test_models_health_metrics_reset(mock: tuple[MockServer, httpx.Client]) -> None:
    server, client = mock
    health = client.get("/health")
    assert health.status_code == 200 and health.content == b""
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["mock"] and models["object"] == "list"
    assert client.post("/reset_prefix_cache").status_code == 200
    before = dict(server.counters)
    client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4,
                                         "ignore_eos": True})
    text = client.get("/metrics").text
    assert f'vllm:generation_tokens_total{{model_name="mock"}} ' \
           f'{before["generation_tokens"] + 4}' in text
    assert f'vllm:prompt_tokens_total{{model_name="mock"}} {before["prompt_tokens"] + 3}' in text
    assert 'vllm:num_requests_running{model_name="mock"} 0' in text


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v1/completions", {"prompt": [1], "max_tokens": 0}, 400, "max_tokens must be an integer"),
    ("/v1/completions", {"prompt": [1], "max_tokens": True}, 400, "max_tokens must be"),
    ("/v1/completions", {"prompt": [1], "n": 2}, 400, "n (2) must be 1"),
    ("/v1/completions", {"prompt": [[1], [2]]}, 400, "prompt must be a string"),
    ("/v1/completions", {"prompt": [1], "model": "other"}, 404, "`other` does not exist"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages must be a non-empty list"),
])
def test_refusals_carry_vllms_error_body(mock: tuple[MockServer, httpx.Client], path: str,
                                         body: dict[str, Any], status: int,
                                         needle: str) -> None:
    resp = mock[1].post(path, json=body)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert needle in err["message"] and err["code"] == status
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_bad_json_unknown_path_and_method(mock: tuple[MockServer, httpx.Client]) -> None:
    _, client = mock
    resp = client.post("/v1/completions", content=b"{nope",
                       headers={"content-type": "application/json"})
    assert resp.status_code == 400 and "not JSON" in resp.json()["error"]["message"]
    assert client.get("/v2/anything").status_code == 404
    assert client.get("/v1/completions").status_code == 405
    assert client.get("/health").status_code == 200  # the connection pool still works


def test_the_harness_runs_against_it(mock: tuple[MockServer, httpx.Client]) -> None:
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.http_target import OpenAITarget
    from workbench.harness.replay import run, run_sync
    from workbench.harness.workloads import BenchRequest, Workload

    server, _ = mock
    reqs = tuple(BenchRequest(f"r{i}", [1, 2, 3], 4 + i) for i in range(4))
    target = OpenAITarget(f"http://127.0.0.1:{server.port}/v1", None, poll_interval_s=None)
    try:
        res = run(target, Workload("mock", 0, {}, reqs), ArrivalSpec(mode="closed",
                                                                     concurrency=2))
    finally:
        run_sync(target.stop)
    assert target.model == "mock"  # resolved from /v1/models
    assert res.error is None and all(r.success for r in res.records)
    assert sorted((r.request_id, r.output_tokens, len(r.chunk_times_s)) for r in res.records) \
        == [(f"r{i}", 4 + i, 4 + i) for i in range(4)]
    assert res.server_delta["vllm:generation_tokens_total"] == 4 + 5 + 6 + 7  # not the warm-up


@pytest.mark.parametrize(("kw", "needle"), [
    ({"port": 70000}, "port must be an integer in [0, 65535], got 70000"),
    ({"token_delay_s": -1}, "token_delay_s must be seconds in [0, 60), got -1"),
    ({"default_max_tokens": 0}, "default_max_tokens must be an integer >= 1, got 0"),
    ({"eos_after": 0}, "eos_after must be an integer >= 1 or None, got 0"),
    ({"model": ""}, "model must be a non-empty served model name"),
])
def test_config_refuses_bad_values(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        MockConfig(**kw)
    assert needle in str(e.value)


def test_program_binds_localhost_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "workbench.bench.mock_openai", "--port", "0",
                             "--token-delay-s", "0.001"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("mock OpenAI server on http://127.0.0.1:"), line
        url = line.split()[4]
        deadline = time.monotonic() + 30
        while httpx.get(url.removesuffix("/v1") + "/health", trust_env=False).status_code != 200:
            assert time.monotonic() < deadline
        body = httpx.post(url + "/completions", json={"prompt": [1], "max_tokens": 2},
                          trust_env=False).json()
        assert body["usage"]["completion_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0


def test_pin_to_cpus_keeps_a_valid_set() -> None:
    import os

    before = os.sched_getaffinity(0)
    pin_to_cpus(sorted(before))  # the same set: nothing changes, every thread accepted it
    assert os.sched_getaffinity(0) == before
