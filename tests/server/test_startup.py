"""Start-up in the background: /health is 503 with the reason while the engine is built, the
kernels loaded and the warm-up request runs; other routes answer 503 meanwhile; ready means
served at once, with /metrics counters at zero. A failed start-up says why (and `workbench
serve` exits). /health stays fast while a maximal (~4 MB) request is being tokenized."""

from __future__ import annotations

import logging
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from kernels.cpu import kernel_status
from tests.server.conftest import ServerHandle, make_app
from workbench.entrypoints.openai.protocol import prompts
from workbench.server import startup


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    """The app under uvicorn, without waiting for /health (start_server would)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # NODELAY
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _poll(url: str, until: Any, timeout_s: float = 600.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/health", timeout=10)
            if until(r):
                return r
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"/health never reached the expected state at {url}")


def test_health_is_503_with_the_reason_until_warm_and_metrics_start_at_zero(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="workbench.server.startup")
    release, real = threading.Event(), startup.warm_up
    monkeypatch.setattr(startup, "warm_up", lambda e: (release.wait(120), real(e))[1])
    app = make_app(model_dir)
    server, thread, url = _serve(app)
    try:
        r = _poll(url, lambda r: r.status_code == 503 and r.json().get("phase") == "warm-up")
        body = r.json()
        assert set(body) == {"status", "phase", "reason", "elapsed_s"}
        assert body["status"] == "starting" and body["elapsed_s"] > 0
        assert body["reason"].startswith("warming up: running one warm-up request (")
        st = app.state.startup
        assert list(st.timings_s) == ["engine", "kernels"]  # done before the warm-up
        assert st.kernels == kernel_status() and "not loaded" not in st.kernels.values()
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"),
                             ("GET", "/metrics"), ("POST", "/reset_prefix_cache")):
            r = httpx.request(method, url + path, json={"prompt": "a"}, timeout=10)
            assert r.status_code == 503, path
            err = r.json()["error"]
            assert err["code"] == 503 and err["type"] == "ServiceUnavailableError"
            assert err["message"].startswith("the server is not ready: warming up: running "
                                             "one warm-up request")
        assert httpx.get(f"{url}/openapi.json", timeout=10).status_code == 200
        assert not hasattr(app.state, "engine")

        release.set()
        assert _poll(url, lambda r: r.status_code == 200).json() == {"status": "ready"}
        handle = ServerHandle(app, url, server, thread)
        m = handle.metrics()
        zero = ["vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                "vllm:num_preemptions_total", "vllm:kv_cache_usage_perc",
                "vllm:iteration_tokens_total_count"] + [
            f"vllm:request_success_total{{finished_reason={r}}}"
            for r in ("stop", "length", "abort", "error")]
        assert {k: m[k] for k in zero} == dict.fromkeys(zero, 0.0)
        assert handle.engine.engine.stats.num_steps == 0
        assert handle.free_blocks() == handle.total_blocks
        c = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "prompt": "hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}).json()
        assert c["usage"]["completion_tokens"] == 3
        m = handle.metrics()
        assert m["vllm:generation_tokens_total"] == 3
        assert m["vllm:request_success_total{finished_reason=length}"] == 1
        assert m["vllm:prompt_tokens_total"] == c["usage"]["prompt_tokens"]
        assert m["vllm:prefix_cache_queries_total"] == c["usage"]["prompt_tokens"]
    finally:
        release.set()
        server.should_exit = True
        thread.join(30)
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("server ready")]
    assert len(ready) == 1
    phases = list(app.state.startup.timings_s)
    assert phases == ["engine", "kernels", "warm-up"]
    # "server ready in 9.1 s: engine 1.0 s, kernels 0.1 s (paged_decode=..., ...), warm-up
    # 7.9 s (warm-up: 2 engine steps)"
    msg = ready[0]
    assert msg.startswith("server ready in ") and msg.endswith("(warm-up: 2 engine steps)")
    for phase in phases:
        assert f"{phase} {app.state.startup.timings_s[phase]:.1f} s" in msg
    assert all(f"{k}={v}" in msg for k, v in kernel_status().items())
    assert app.state.engine.is_running is False  # stopped with the server


def test_failed_start_up_says_why(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(engine: Any) -> int:
        raise RuntimeError("warm-up exploded")

    monkeypatch.setattr(startup, "warm_up", boom)
    failures: list[str] = []
    app = make_app(model_dir, on_startup_failure=failures.append)
    server, thread, url = _serve(app)
    try:
        r = _poll(url, lambda r: r.json().get("status") == "failed")
        assert r.status_code == 503
        assert r.json()["reason"] == ("start-up failed (warm-up): RuntimeError: warm-up "
                                      "exploded")
        assert failures == ["warm-up: RuntimeError: warm-up exploded"]
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "a"}, timeout=10)
        assert r.status_code == 503 and "warm-up exploded" in r.json()["error"]["message"]
    finally:
        server.should_exit = True
        thread.join(30)


def test_serve_exits_when_start_up_fails(model_dir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.server.serve", "--model", str(model_dir),
         "--kv-cache-memory-bytes", "1", "--port", str(port)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench serve: start-up failed in phase engine: ValueError: the "
                           "KV cache from kv_cache_memory_bytes has")
    assert "start-up: building the engine" in proc.stderr  # the log says what it was doing


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_health_answers_fast_while_a_4mb_prompt_is_tokenized(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch, route: str,
) -> None:
    """The prompt is prepared in a worker thread and the fast tokenizer releases the GIL:
    /health answers within milliseconds meanwhile (it waited the whole tokenization, 10 s,
    when that ran on the event loop). Bounds: every answer < 1 s, the median < 100 ms."""
    server.wait_idle()
    limit = server.app.state.serving.max_body_bytes
    text = ("the quick brown fox jumps over the lazy dog " * (limit // 44))[: limit - 1024]
    body = ({"prompt": text} if route == "completions"
            else {"messages": [{"role": "user", "content": text}]})
    window = {"start": threading.Event(), "end": threading.Event()}
    real_encode = prompts.encode

    def encode(*args: Any, **kwargs: Any) -> list[int]:
        window["start"].set()
        try:
            return real_encode(*args, **kwargs)
        finally:
            window["end"].set()

    monkeypatch.setattr(prompts, "encode", encode)
    result: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: result.update(r=httpx.post(
        f"{server.base_url}/v1/{route}", json=body, timeout=300)))
    t.start()
    assert window["start"].wait(120)
    latencies: list[float] = []
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        while not window["end"].is_set():
            t0 = time.perf_counter()
            r = client.get("/health")
            if window["end"].is_set():
                break  # this sample may have straddled the end of the window
            latencies.append(time.perf_counter() - t0)
            assert r.status_code == 200
            time.sleep(0.02)
    t.join(300)
    r = result["r"]
    assert r.status_code == 400 and r.json()["error"]["param"] == (
        "prompt" if route == "completions" else "messages")
    assert "tokens; to generate at least one token within max_model_len" in r.text
    print(f"\n/health during a {len(text) / 1e6:.1f} MB {route} prompt: {len(latencies)} "
          f"samples, median {statistics.median(latencies) * 1e3:.1f} ms, max "
          f"{max(latencies) * 1e3:.1f} ms")
    assert len(latencies) >= 5, f"the tokenization window held only {len(latencies)} samples"
    assert max(latencies) < 1.0 and statistics.median(latencies) < 0.1, latencies
