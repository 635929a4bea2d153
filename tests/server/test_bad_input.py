"""Bad input is a 4xx with an OpenAI-style error object naming the field, while another
client's stream goes on untouched; a client that disconnects frees its KV blocks."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import (
    ENGINE_KW,
    MODEL_NAME,
    ServerHandle,
    make_app,
    start_server,
    stop_server,
)

MML = ENGINE_KW["max_model_len"]
LONG_IDS = [5 + i % 900 for i in range(MML + 10)]
CHAT = [{"role": "user", "content": "hi"}]

# (name, path, body, status, param)
CASES: list[tuple[str, str, Any, int, str | None]] = [
    ("missing prompt", "completions", {"max_tokens": 4}, 400, "prompt"),
    ("missing messages", "chat/completions", {"max_tokens": 4}, 400, "messages"),
    ("empty messages", "chat/completions", {"messages": []}, 400, "messages"),
    ("body not an object", "completions", [1, 2, 3], 400, None),
    ("prompt wrong type", "completions", {"prompt": 12}, 400, "prompt"),
    ("prompt mixed list", "completions", {"prompt": [1, "a"]}, 400, "prompt"),
    ("temperature a string", "completions", {"prompt": "a", "temperature": "hot"}, 400,
     "temperature"),
    ("max_tokens a string", "completions", {"prompt": "a", "max_tokens": "5"}, 400,
     "max_tokens"),
    ("max_tokens a float", "completions", {"prompt": "a", "max_tokens": 2.5}, 400, "max_tokens"),
    ("stream not a bool", "completions", {"prompt": "a", "stream": "yes"}, 400, "stream"),
    ("content wrong type", "chat/completions", {"messages": [{"role": "user", "content": 5}]},
     400, "messages.0.content"),
    ("role missing", "chat/completions", {"messages": [{"content": "x"}]}, 400,
     "messages.0.role"),
    ("image content part", "chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "messages.0.content"),
    ("max_tokens above what fits", "completions", {"prompt": "a b", "max_tokens": MML}, 400,
     "max_tokens"),
    ("max_completion_tokens above what fits", "chat/completions",
     {"messages": CHAT, "max_completion_tokens": MML}, 400, "max_completion_tokens"),
    ("max_tokens zero", "completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("prompt longer than max_model_len", "completions", {"prompt": LONG_IDS}, 400, "prompt"),
    ("text prompt longer than max_model_len", "completions", {"prompt": "a b c " * 400}, 400,
     "prompt"),
    ("chat longer than max_model_len", "chat/completions",
     {"messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages"),
    ("unknown model", "completions", {"model": "gpt-9", "prompt": "a"}, 404, "model"),
    ("n too large", "completions", {"prompt": "a", "n": 17}, 400, "n"),
    ("n zero", "chat/completions", {"messages": CHAT, "n": 0}, 400, "n"),
    ("negative temperature", "completions", {"prompt": "a", "temperature": -0.5}, 400,
     "temperature"),
    ("top_p zero", "completions", {"prompt": "a", "top_p": 0.0}, 400, "top_p"),
    ("top_k below -1", "completions", {"prompt": "a", "top_k": -2}, 400, "top_k"),
    ("min_tokens above max_tokens", "completions",
     {"prompt": "a", "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
    ("token id out of vocabulary", "completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("empty stop string", "completions", {"prompt": "a", "stop": [""]}, 400, "stop"),
    ("logprobs unsupported", "completions", {"prompt": "a", "logprobs": 3}, 400, "logprobs"),
    ("penalty unsupported", "chat/completions", {"messages": CHAT, "presence_penalty": 1.0},
     400, "presence_penalty"),
    ("stream_options without stream", "completions",
     {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
]


def _check_error(r: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["param"] == param
    assert err["message"] and (param is None or param.split(".")[0] in err["message"])
    return err


@pytest.fixture()
def background_stream(idle_server: ServerHandle) -> Any:
    """Another client's long stream, running while the bad requests arrive."""
    result: dict[str, Any] = {}
    body = {"prompt": "keep going", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}

    def run() -> None:
        with httpx.stream("POST", f"{idle_server.base_url}/v1/completions", json=body,
                          timeout=120) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        result["status"] = r.status_code
        result["last"] = json.loads(lines[-2][6:])
        result["done"] = lines[-1]

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    yield result
    t.join(timeout=120)
    assert result["status"] == 200 and result["done"] == "data: [DONE]"
    assert result["last"]["usage"]["completion_tokens"] == 200


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_names_the_field(
    idle_server: ServerHandle, name: str, path: str, body: Any, status: int, param: str | None,
) -> None:
    r = httpx.post(f"{idle_server.base_url}/v1/{path}", json=body, timeout=30)
    err = _check_error(r, status, param)
    assert err["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_bad_inputs_while_another_client_streams(
    idle_server: ServerHandle, background_stream: dict[str, Any]
) -> None:
    url = idle_server.base_url
    for _, path, body, status, param in CASES:
        _check_error(httpx.post(f"{url}/v1/{path}", json=body, timeout=30), status, param)
    bad_json = httpx.post(f"{url}/v1/completions", content=b'{"prompt": "a",',
                          headers={"content-type": "application/json"})
    assert "not valid JSON" in _check_error(bad_json, 400, None)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).completions.create(
            model=MODEL_NAME, prompt="a", max_tokens=MML)
    assert e.value.body["param"] == "max_tokens"


def test_oversized_body_is_413(idle_server: ServerHandle) -> None:
    limit = idle_server.app.state.serving.max_body_bytes
    big = json.dumps({"prompt": "a" * (limit + 10)}).encode()
    r = httpx.post(f"{idle_server.base_url}/v1/completions", content=big,
                   headers={"content-type": "application/json"}, timeout=60)
    _check_error(r, 413, None)

    def chunked() -> Any:  # no content-length: the limit is enforced while reading
        for i in range(0, len(big), 1 << 16):
            yield big[i:i + (1 << 16)]

    r = httpx.post(f"{idle_server.base_url}/v1/completions", content=chunked(), timeout=60)
    assert "content-length" not in r.request.headers
    _check_error(r, 413, None)


def test_unknown_route_and_method(idle_server: ServerHandle) -> None:
    _check_error(httpx.get(f"{idle_server.base_url}/v1/nothing"), 404, None)
    _check_error(httpx.get(f"{idle_server.base_url}/v1/completions"), 405, None)


def test_stream_disconnect_aborts_and_frees_blocks(idle_server: ServerHandle) -> None:
    before = idle_server.metrics()
    body = {"prompt": "disconnect me", "max_tokens": 240, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{idle_server.base_url}/v1/completions", json=body) as r:
        it = r.iter_lines()
        got = [ln for ln in (next(it) for _ in range(6)) if ln.startswith("data: ")]
        assert got and idle_server.free_blocks() < idle_server.total_blocks
    # leaving the block closed the connection mid-stream
    idle_server.wait_idle(timeout_s=10)
    after = idle_server.metrics()
    key = "vllm:request_success_total{finished_reason=abort}"
    assert after[key] == before[key] + 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 240


def test_non_streaming_disconnect_aborts_and_frees_blocks(idle_server: ServerHandle) -> None:
    before = idle_server.metrics()
    host, port = idle_server.base_url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "disconnect me too", "max_tokens": 240, "temperature": 0,
                       "ignore_eos": True}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 10
        while idle_server.engine.num_in_flight() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert idle_server.engine.num_in_flight() == 1
    idle_server.wait_idle(timeout_s=10)
    after = idle_server.metrics()
    key = "vllm:request_success_total{finished_reason=abort}"
    assert after[key] == before[key] + 1


def test_failed_step_fails_only_its_requests_and_a_stopped_engine_is_503(model_dir: Any) -> None:
    handle = start_server(make_app(model_dir))
    url = f"{handle.base_url}/v1/completions"
    body = {"prompt": "x", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    try:
        runner = handle.engine.engine.runner
        real = runner.execute_model
        calls = {"n": 0}

        def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected step failure")
            return real(*args, **kwargs)

        runner.execute_model = flaky  # type: ignore[method-assign]
        with httpx.stream("POST", url, json={**body, "stream": True}) as r:
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]"
        err = json.loads(lines[-2][6:])["error"]
        assert err["code"] == 500 and "injected step failure" in err["message"]
        ok = httpx.post(url, json=body, timeout=30)  # the next request is served normally
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
        metrics = handle.metrics()
        assert metrics["vllm:request_success_total{finished_reason=error}"] == 1
        handle.engine.stop()
        _check_error(httpx.post(url, json=body, timeout=30), 503, None)
        assert httpx.get(f"{handle.base_url}/health").status_code == 503
    finally:
        stop_server(handle)
