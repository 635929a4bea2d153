"""OpenAITarget against a fake OpenAI/vLLM server with controlled timings and /metrics.

The fake (FastAPI on a uvicorn thread) streams `max_tokens` tokens as SSE, `ttft_s` after the
request and `itl_s` apart, ends with a usage event carrying server-side timings, and exposes
vLLM's Prometheus names through prometheus_client. Request ids steer failures:
"fail*" -> HTTP 500, "stall*" -> no byte for 30 s, "midfail*" -> an error event mid-stream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from workbench.harness import prom
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.http_target import OpenAITarget
from workbench.harness.join import join_client_server, overhead_table, server_side
from workbench.harness.metrics import RequestRecord
from workbench.harness.replay import run, run_sync
from workbench.harness.workloads import BenchRequest, Workload

MODEL = "fake-model"


class FakeOpenAI:
    """A vLLM-shaped server whose behaviour the test sets (see the module docstring)."""

    def __init__(self, ttft_s: float = 0.03, itl_s: float = 0.005) -> None:
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.tokens_per_chunk = 1
        self.send_usage = True
        self.reset_status = 200
        self.received: list[dict[str, Any]] = []
        self.disconnected: list[str] = []
        self.running = 0
        reg = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.g_running = Gauge("vllm:num_requests_running", "r", lab, registry=reg)
        self.g_waiting = Gauge("vllm:num_requests_waiting", "w", lab, registry=reg)
        self.g_kv = Gauge("vllm:kv_cache_usage_perc", "kv", lab, registry=reg)
        self.c_prompt = Counter("vllm:prompt_tokens", "p", lab, registry=reg)
        self.c_gen = Counter("vllm:generation_tokens", "g", lab, registry=reg)
        self.h_ttft = Histogram("vllm:time_to_first_token_seconds", "t", lab, registry=reg)
        self.h_e2e = Histogram("vllm:e2e_request_latency_seconds", "e", lab, registry=reg)
        self.h_queue = Histogram("vllm:request_queue_time_seconds", "q", lab, registry=reg)
        self.g_waiting.labels(MODEL).set(0)
        self.g_kv.labels(MODEL).set(0.25)
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> PlainTextResponse:
            return PlainTextResponse("")

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            return PlainTextResponse(generate_latest(self.registry).decode())

        @app.post("/reset_prefix_cache")
        async def reset() -> PlainTextResponse:
            return PlainTextResponse("", status_code=self.reset_status)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await self._handle(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await self._handle(request, chat=True)

        return app

    async def _handle(self, request: Request, chat: bool) -> Any:
        arrival = time.perf_counter()
        body = await request.json()
        rid = request.headers.get("x-request-id", "none")
        self.received.append({"body": body, "headers": dict(request.headers), "chat": chat})
        headers = {"x-request-id": rid}
        if body.get("model") != MODEL:
            return JSONResponse({"error": {"message": f"model {body.get('model')} not found"}},
                                status_code=404, headers=headers)
        if rid.startswith("fail"):
            return JSONResponse({"error": {"message": "engine exploded"}}, status_code=500,
                                headers=headers)
        return StreamingResponse(self._events(body, rid, chat, arrival),
                                 media_type="text/event-stream", headers=headers)

    async def _events(self, body: dict[str, Any], rid: str, chat: bool, arrival: float
                      ) -> AsyncIterator[bytes]:
        prompt = body.get("prompt") if not chat else body["messages"][0]["content"]
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        n_out = int(body.get("max_tokens") or body.get("max_completion_tokens"))
        opts = body.get("stream_options") or {}
        continuous = bool(opts.get("continuous_usage_stats"))
        self.running += 1
        self.g_running.labels(MODEL).set(self.running)
        try:
            if rid.startswith("stall"):
                await asyncio.sleep(30)
            await asyncio.sleep(self.ttft_s)
            first = time.perf_counter()
            sent = 0
            while sent < n_out:
                k = min(self.tokens_per_chunk, n_out - sent)
                sent += k
                text = " tok" * k
                choice: dict[str, Any] = (
                    {"index": 0, "delta": {"content": text}} if chat
                    else {"index": 0, "text": text})
                choice["finish_reason"] = "length" if sent == n_out else None
                ev: dict[str, Any] = {"id": f"cmpl-{rid}", "choices": [choice]}
                if continuous:
                    ev["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": sent}
                yield f"data: {json.dumps(ev)}\n\n".encode()
                if rid.startswith("midfail"):
                    err = {"error": {"message": "oom mid-stream", "code": 500}}
                    yield f"data: {json.dumps(err)}\n\n".encode()
                    return
                if sent < n_out:
                    await asyncio.sleep(self.itl_s)
            end = time.perf_counter()
            self.c_prompt.labels(MODEL).inc(n_prompt)
            self.c_gen.labels(MODEL).inc(n_out)
            self.h_ttft.labels(MODEL).observe(first - arrival)
            self.h_e2e.labels(MODEL).observe(end - arrival)
            self.h_queue.labels(MODEL).observe(0.001)
            if self.send_usage and opts.get("include_usage"):
                final = {"id": f"cmpl-{rid}", "choices": [],
                         "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out},
                         "server_timing": {"queue_s": 0.001, "ttft_s": first - arrival,
                                           "e2e_s": end - arrival}}
                yield f"data: {json.dumps(final)}\n\n".encode()
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.disconnected.append(rid)
            raise
        finally:
            self.running -= 1
            self.g_running.labels(MODEL).set(self.running)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Run `app` on a free localhost port in a thread; yields http://127.0.0.1:PORT."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=1))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "fake server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        th.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeOpenAI, str]]:
    f = FakeOpenAI()
    with serve(f.app) as url:
        yield f, url + "/v1"


@pytest.fixture(autouse=True)
def _reset(fake: tuple[FakeOpenAI, str]) -> None:
    f = fake[0]
    f.tokens_per_chunk, f.send_usage, f.reset_status = 1, True, 200
    f.received.clear()


def _workload(n: int, max_tokens: int = 4, prefix: str = "r") -> Workload:
    reqs = tuple(BenchRequest(f"{prefix}{i}", list(range(10 + i)), max_tokens,
                              prompt=" ".join(["w"] * (10 + i))) for i in range(n))
    return Workload("fake", 0, {}, reqs)


def _one(target: OpenAITarget, req: BenchRequest) -> RequestRecord:
    async def go() -> RequestRecord:
        await target.start()
        rec = RequestRecord(req.request_id, 0, 0, False)
        rec.start_s = target.now_s()
        await target.generate(req, rec)
        return rec

    return run_sync(go)


@pytest.fixture
def target(fake: tuple[FakeOpenAI, str]) -> Iterator[OpenAITarget]:
    t = OpenAITarget(fake[1], MODEL, poll_interval_s=0.05, timeout_s=5.0)
    yield t
    run_sync(t.stop)


def test_run_streams_like_vllm(fake: tuple[FakeOpenAI, str], target: OpenAITarget) -> None:
    f, _ = fake
    res = run(target, _workload(6), ArrivalSpec(mode="closed", concurrency=2), warmup_requests=1)
    assert res.error is None and res.validity.valid
    body = next(r["body"] for r in f.received if r["headers"]["x-request-id"] == "r3")
    assert body["prompt"] == list(range(13)) and body["max_tokens"] == 4
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0.0 and body["model"] == MODEL
    for r in res.records:
        assert r.success, r.error
        assert r.output_tokens == 4 and len(r.chunk_times_s) == 4 and r.chunk_tokens == [1] * 4
        assert r.ttft_s is not None and r.ttft_s >= f.ttft_s
        assert sum(r.itls_s) == pytest.approx(r.chunk_times_s[-1] - r.first_token_s)
        assert r.end_s == r.chunk_times_s[-1]  # vLLM's latency: the last token chunk
        assert r.server_ttft_s is not None and r.server_ttft_s <= r.ttft_s
        assert r.server_queue_s == pytest.approx(0.001)
        assert r.server_decode_s == pytest.approx(r.server_e2e_s - r.server_ttft_s)
    m = res.metrics()
    assert m["completed"] == 6 and m["total_output_tokens"] == 24
    # the server sleeps itl_s between chunks; on a loaded machine single gaps may squeeze
    assert 0 < m["mean_itl_ms"] / 1000 < 20 * f.itl_s and m["p99_itl_ms"] / 1000 > f.itl_s / 2
    # /metrics before/after: counter deltas and the histogram means of exactly this run
    side = server_side(res, target)
    d = side["delta"]
    assert d["vllm:generation_tokens_total"] == 24
    assert d["vllm:e2e_request_latency_seconds_count"] == 6 and side["count_check"] is None
    server_ttft = [r.server_ttft_s for r in res.records]
    assert d["vllm:time_to_first_token_seconds:mean_delta"] == pytest.approx(
        sum(server_ttft) / 6)
    # ids echoed and joined; the poller saw the run
    assert all(target.responses[r.request_id]["x_request_id"] == r.request_id
               for r in res.records)
    frame = join_client_server(res.records, target.server_rows())
    assert frame["matched"].all() and (frame["ttft_overhead_ms"] >= 0).all()
    assert frame.attrs["unmatched_server_rows"] == 1  # the warm-up request
    series = side["series"]
    assert series and all(0 <= row["t_s"] <= res.duration_s + 0.5 for row in series)
    assert max(row["running"] for row in series) >= 1 and "kv_cache_usage_perc" in series[0]
    assert "server_series.csv" in side["files"] and "client_server_join.csv" in side["files"]


def test_usage_per_chunk_and_missing_usage(fake: tuple[FakeOpenAI, str]) -> None:
    f, url = fake
    t = OpenAITarget(url, MODEL, continuous_usage_stats=True, poll_interval_s=None)
    f.tokens_per_chunk = 2
    try:
        rec = _one(t, BenchRequest("c0", [1, 2, 3], 5))
        assert rec.success and rec.chunk_tokens == [2, 2, 1] and rec.output_tokens == 5
        assert f.received[-1]["body"]["stream_options"]["continuous_usage_stats"] is True
        f.send_usage = False  # the server ignores include_usage: count chunks
        t.continuous_usage_stats = False
        rec = _one(t, BenchRequest("c1", [1, 2, 3], 5))
        assert rec.success and rec.chunk_tokens == [1, 1, 1] and rec.output_tokens == 3
    finally:
        run_sync(t.stop)


def test_failures_are_records_not_exceptions(fake: tuple[FakeOpenAI, str]) -> None:
    _, url = fake
    t = OpenAITarget(url, MODEL, timeout_s=0.3, poll_interval_s=None)
    try:
        rec = _one(t, BenchRequest("fail0", [1], 3))
        assert not rec.success and "HTTP 500" in rec.error and "engine exploded" in rec.error
        rec = _one(t, BenchRequest("stall0", [1], 3))
        assert not rec.success and rec.error.startswith("timeout") and rec.end_s is not None
        rec = _one(t, BenchRequest("midfail0", [1], 3))
        assert not rec.success and "oom mid-stream" in rec.error and rec.chunk_times_s
    finally:
        run_sync(t.stop)
    bad = OpenAITarget(url, "other-model", poll_interval_s=None)
    with pytest.raises(ValueError, match="not served"):
        run_sync(bad.start)
    with pytest.raises(RuntimeError, match="no OpenAI-compatible server"):
        run_sync(OpenAITarget("http://127.0.0.1:9/v1", MODEL, poll_interval_s=None).start)


def test_chat_text_prompts_and_reset(fake: tuple[FakeOpenAI, str]) -> None:
    f, url = fake
    t = OpenAITarget(url, None, endpoint="chat", ignore_eos=False, poll_interval_s=None)
    try:
        rec = _one(t, BenchRequest("chat0", [5, 6], 3, prompt="hello there"))
        assert t.model == MODEL  # None: the one served model
        body = f.received[-1]["body"]
        assert body["messages"] == [{"role": "user", "content": "hello there"}]
        assert body["max_completion_tokens"] == 3 and "ignore_eos" not in body
        assert rec.success and rec.output_tokens == 3 and rec.prompt_tokens == 2
        assert run_sync(t.reset_prefix_cache) is True
        f.reset_status = 404
        assert run_sync(t.reset_prefix_cache) is False
    finally:
        run_sync(t.stop)
    with pytest.raises(ValueError, match="chat endpoint takes text"):
        OpenAITarget(url, MODEL, endpoint="chat", prompt_mode="token_ids")
    text = OpenAITarget(url, MODEL, prompt_mode="text")
    assert text.payload(BenchRequest("x", [1, 2], 2, prompt="a b"))["prompt"] == "a b"


def test_cancel_aborts_the_stream_and_target_survives_loops(
    fake: tuple[FakeOpenAI, str], target: OpenAITarget
) -> None:
    f, _ = fake

    async def cancel_midway() -> RequestRecord:
        await target.start()
        rec = RequestRecord("long0", 0, 0, False)
        task = asyncio.ensure_future(target.generate(BenchRequest("long0", [1], 400), rec))
        await asyncio.sleep(f.ttft_s + 0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return rec

    rec = run_sync(cancel_midway)
    assert 0 < len(rec.chunk_times_s) < 400
    deadline = time.monotonic() + 3
    while "long0" not in f.disconnected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "long0" in f.disconnected  # the server saw the client go away
    # a second run on a fresh asyncio loop reuses the same target
    res = run(target, _workload(2, prefix="again"), ArrivalSpec(mode="closed", concurrency=2),
              warmup_requests=0)
    assert all(r.success for r in res.records)
    table = overhead_table(res, res)
    assert list(table.index) == ["in-process", "http", "http - in-process"]
    assert table.loc["http - in-process", "median_client_ttft_ms"] == 0


def test_poller_scrapes_every_interval(fake: tuple[FakeOpenAI, str]) -> None:
    _, url = fake

    async def poll() -> prom.Poller:
        async with prom.Poller(prom.metrics_url(url), interval_s=0.05) as p:
            await asyncio.sleep(0.32)
        return p

    p = run_sync(poll)
    assert 5 <= len(p.rows) <= 10 and p.errors == 0
    assert [r["step"] for r in p.rows] == list(range(len(p.rows)))
    assert {"running", "waiting", "kv_cache_usage_perc", "t_s"} <= set(p.rows[0])

    async def dead() -> prom.Poller:
        async with prom.Poller("http://127.0.0.1:9/metrics", interval_s=0.05) as p:
            await asyncio.sleep(0.12)
        return p

    p = run_sync(dead)
    assert p.rows == [] and p.errors >= 2 and "ConnectError" in (p.last_error or "")


def test_sse_parsing_rules() -> None:
    from workbench.entrypoints.openai.protocol.sse import SSEDecoder
    from workbench.harness.sse import StreamParser

    dec = SSEDecoder()
    raw = b'data: {"a": 1}\r\n\r\n: ping\n\nevent: x\ndata: {"b":\ndata: 2}\n\ndata: [DO'
    assert dec.feed(raw[:7]) == [] and dec.feed(raw[7:]) == ['{"a": 1}', '{"b":\n2}']
    assert dec.feed(b"NE]") == [] and dec.flush() == ["[DONE]"]
    assert SSEDecoder().feed("data: \u00e9\n\n".encode()[:7]) == []  # half a UTF-8 char waits

    # workbench serve's chat stream: a role chunk before any token, token_ids per step, a
    # finish chunk, then usage + per-request metrics (ms) on the last chunk
    rec = RequestRecord("q", 0, 0, False)
    p = StreamParser(rec, chat=True)
    events = [
        (0.01, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
        (0.05, {"choices": [{"delta": {"content": "he"}, "token_ids": [7, 8]}]}),
        (0.06, {"choices": [{"delta": {"content": ""}, "token_ids": [9]}]}),  # partial UTF-8
        (0.07, {"choices": [{"delta": {}, "token_ids": [], "finish_reason": "length"}]}),
        (0.08, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3},
                "metrics": {"queue_time_ms": 2.0, "time_to_first_token_ms": 30.0,
                            "arrival_to_first_token_ms": 32.0, "decode_time_ms": 15.0,
                            "e2e_latency_ms": 47.0}}),
    ]
    for t, ev in events:
        p.feed(json.dumps(ev), t)
    p.feed("[DONE]", 0.09)
    p.finish(0.09)
    assert rec.success and rec.first_token_s == 0.05 and rec.chunk_times_s == [0.05, 0.06]
    assert rec.chunk_tokens == [2, 1] and rec.end_s == 0.06 and rec.output_tokens == 3
    assert rec.prompt_tokens == 5 and p.info["finish_reason"] == "length" and p.info["done"]
    assert rec.server_queue_s == pytest.approx(0.002)
    assert rec.server_prefill_s == pytest.approx(0.030)  # vLLM's per-request "TTFT"
    assert rec.server_ttft_s == pytest.approx(0.032) and rec.server_e2e_s == pytest.approx(0.047)
    assert rec.server_kv_transfer_s is None and rec.server_kv_wait_s is None  # none read

    # a disaggregated decode instance's last chunk: the KV it read from the prefill instance
    rec = RequestRecord("d", 0, 0, False)
    p = StreamParser(rec)
    p.feed(json.dumps({"choices": [{"text": "a", "finish_reason": "length"}],
                       "metrics": {"kv_transfer_bytes": 53248, "kv_transfer_ms": 1.5,
                                   "kv_transfer_wait_ms": 4.0}}), 0.1)
    p.finish(0.1)
    assert rec.server_kv_transfer_bytes == 53248
    assert rec.server_kv_transfer_s == pytest.approx(0.0015)
    assert rec.server_kv_wait_s == pytest.approx(0.004)

    # vLLM's rule without token counts: every event with choices is a token chunk
    rec = RequestRecord("c", 0, 0, False)
    p = StreamParser(rec)
    for t, text in ((0.1, "a"), (0.2, ""), (0.3, "b")):
        p.feed(json.dumps({"choices": [{"text": text}]}), t)
    p.finish(0.4)
    assert rec.chunk_times_s == [0.1, 0.2, 0.3] and rec.output_tokens == 3 and rec.end_s == 0.3
    rec = RequestRecord("e", 0, 0, False)
    p = StreamParser(rec)
    p.feed("not json", 0.1)
    p.finish(0.2)
    assert not rec.success and "malformed" in (rec.error or "") and rec.end_s == 0.2


def test_cli_against_the_fake(fake: tuple[FakeOpenAI, str], tmp_path: Any,
                              capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.bench.cli import main, parse_arrivals
    from workbench.config.named_models import bundled_checkpoint

    _, url = fake
    out = tmp_path / "run.json"
    main(["--target", url.removesuffix("/v1"), "--model", MODEL, "--workload", "balanced-chat",
          "--tokenizer", str(bundled_checkpoint()), "--num-requests", "5", "--param",
          "output_len=3", "--arrivals", "closed:2", "--poll-interval", "0.05", "--no-mlflow",
          "--json", str(out), "--results-dir", str(tmp_path / "r")])
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "Δcount check | ok" in printed
    (folder,) = (tmp_path / "r" / "bench").iterdir()  # results/<experiment>/<UTC time>/
    assert printed.strip().splitlines()[-1] == f"results folder: {folder}"
    assert sorted(p.name for p in folder.iterdir()) == [
        "requests.csv", "runs.csv", "runs.json", "summary.md"]
    header = (folder / "runs.csv").read_text().splitlines()[0].split(",")
    assert header[:9] == ["target", "model", "workload", "arrivals", "cache_state", "run_id",
                          "status", "valid", "error"]
    assert header[9:] == sorted(header[9:]) and "completed" in header  # the metrics, sorted
    assert json.loads((folder / "runs.json").read_text())[0]["total_output_tokens"] == 15
    assert "Δcount check | ok" in (folder / "summary.md").read_text()
    doc = json.loads(out.read_text())
    assert doc["metrics"]["completed"] == 5 and doc["metrics"]["total_output_tokens"] == 15
    assert doc["server_delta"]["vllm:generation_tokens_total"] == 15
    assert doc["target"]["kind"] == "http" and doc["server_count_check"] is None
    assert parse_arrivals("gamma:8:0.5", seed=3).burstiness == 0.5
    with pytest.raises(SystemExit, match="must be closed:C"):
        parse_arrivals("burst:8")


def test_cli_flags_a_disturbed_run_on_the_console_and_in_mlflow(
        fake: tuple[FakeOpenAI, str], tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.tracking import MlflowClient

    from workbench.bench.cli import main
    from workbench.config.named_models import bundled_checkpoint
    from workbench.harness.validity import FixedCpuWatch

    _, url = fake
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["--target", url, "--model", MODEL, "--workload", "balanced-chat", "--tokenizer",
            str(bundled_checkpoint()), "--num-requests", "3", "--param", "output_len=2",
            "--tracking-uri", uri, "--experiment", "e"]
    main(argv, cpu_watch=FixedCpuWatch(0.9))
    out = capsys.readouterr().out
    # judged: the fake server listens in this process, so its CPU is not "other processes'"
    assert ("INVALID run (http balanced-chat): other processes used 90% of the CPUs during the "
            "run (threshold 25%)") in out
    run_id = out.split("MLflow run ")[1].split()[0]
    client = MlflowClient(tracking_uri=uri)
    r = client.get_run(run_id)
    assert r.data.tags["run_valid"] == "false" and r.data.metrics["other_cpu_share"] == 0.9
    assert r.data.metrics["valid"] == 0.0 and r.data.metrics["completed"] == 3
    main([*argv, "--max-other-cpu-share", "0.95"], cpu_watch=FixedCpuWatch(0.9))
    out = capsys.readouterr().out
    assert "INVALID" not in out
    r = client.get_run(out.split("MLflow run ")[1].split()[0])
    assert r.data.tags["run_valid"] == "true" and r.data.tags["max_other_cpu_share"] == "0.95"


def test_cli_logs_to_mlflow_store(fake: tuple[FakeOpenAI, str], tmp_path: Any,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.bench import cli
    from workbench.config.named_models import bundled_checkpoint
    from workbench.tracking import mlflow_store

    calls: list[tuple[str, Any]] = []

    class FakeStore:
        def __init__(self, name: str, uri: str | None = None) -> None:
            calls.append(("init", (name, uri)))

        def __getattr__(self, method: str) -> Any:
            def record(*a: Any, **kw: Any) -> str:
                calls.append((method, a[1:] if len(a) > 1 else kw))
                return "run-1"
            return record

    monkeypatch.setattr(mlflow_store, "Store", FakeStore)
    _, url = fake
    cli.main(["--target", url, "--model", MODEL, "--workload", "balanced-chat", "--tokenizer",
              str(bundled_checkpoint()), "--num-requests", "3", "--param", "output_len=2",
              "--tracking-uri", "sqlite:///x.db", "--experiment", "e"])
    by = {}
    for method, args in calls:
        by.setdefault(method, []).append(args)
    assert by["init"] == [("e", "sqlite:///x.db")]
    metrics = {k: v for (m,) in by["log_metrics"] for k, v in m.items()}
    assert metrics["completed"] == 3 and metrics["server.vllm:generation_tokens_total"] == 6
    files = {k for (f,) in by["log_files"] for k in f}
    assert {"requests.csv", "summary.md", "server_delta.json", "client_server_join.csv"} <= files
    assert by["set_tags"] == [({"server_count_check": "ok"},)] and "finish" in by


def test_against_workbench_serve(tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The real server (`workbench serve` on the bundled checkpoint) started per variant by
    make_target: engine knobs as flags, ready, streamed, /metrics deltas, stopped."""
    pytest.importorskip("workbench.server.app")
    import sys

    from workbench.config.named_models import bundled_checkpoint
    from workbench.harness.server_process import make_target
    from workbench.harness.workloads import make_workload
    from workbench.models.tokenizer import load_tokenizer

    ckpt = str(bundled_checkpoint())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = {"kind": "http", "base_url": f"http://127.0.0.1:{port}/v1", "model": "bundled",
            "command": [sys.executable, "-m", "workbench.server.serve", "--model", ckpt,
                        "--port", str(port), "--log-level", "warning"],
            "poll_interval_s": 0.02, "log_path": str(tmp_path / "server.log")}
    config = {"dtype": "float32", "max_model_len": 512, "max_num_batched_tokens": 64,
              "max_num_seqs": 8}
    target, server = make_target(spec, config)
    w = make_workload("balanced-chat", 0, load_tokenizer(ckpt), num_requests=8, output_len=16)
    with server:
        try:
            res = run(target, w, ArrivalSpec(mode="closed", concurrency=4), warmup_requests=1)
            pid = server.pid
        finally:
            run_sync(target.stop)
    assert not server.alive and pid is not None
    assert "--max-num-batched-tokens" in server.command and target.model == ckpt
    assert res.error is None, res.error
    for r in res.records:
        assert r.success and r.output_tokens == 16 and r.chunk_times_s, r.error
        assert r.server_ttft_s is not None and 0 < r.server_ttft_s <= r.ttft_s
        assert r.server_queue_s is not None and r.server_e2e_s is not None
    side = server_side(res, target)
    d = side["delta"]
    assert side["count_check"] is None and d["vllm:generation_tokens_total"] == 8 * 16
    assert d["vllm:time_to_first_token_seconds:mean_delta"] == pytest.approx(
        sum(r.server_ttft_s for r in res.records) / 8, rel=0.01, abs=1e-3)
    frame = join_client_server(res.records, target.server_rows())
    assert frame["matched"].all() and (frame["ttft_overhead_ms"] > 0).all()
    assert side["series"] and "kv_cache_usage_perc" in side["series"][0]
    assert "reset_prefix_cache() after the warm-up returned False" not in caplog.text
    # The same workload in-process: the report puts client TTFT beside server TTFT, so the
    # HTTP (and queue) overhead is visible.
    from workbench.harness.targets import InProcessTarget

    local = InProcessTarget(ckpt, engine_kwargs=config)
    try:
        inproc = run(local, w, ArrivalSpec(mode="closed", concurrency=4), warmup_requests=1)
    finally:
        run_sync(local.stop)
    table = overhead_table(inproc, res)
    assert table.loc["in-process", "requests"] == table.loc["http", "requests"] == 8
    for row in ("in-process", "http"):
        assert table.loc[row, "median_client_ttft_ms"] >= table.loc[row, "median_server_ttft_ms"]
        assert table.loc[row, "median_ttft_overhead_ms"] >= 0


def test_cold_cache_state_restarts_the_server_process(fake: tuple[FakeOpenAI, str]) -> None:
    f, url = fake
    restarts: list[float] = []

    class Server:  # stands in for a ServerProcess
        def restart(self) -> None:
            restarts.append(time.perf_counter())

        def describe(self) -> dict[str, Any]:
            return {"command": ["fake"]}

    t = OpenAITarget(url, MODEL, poll_interval_s=None, server=Server())
    try:
        res = run(t, _workload(2, prefix="cold"), ArrivalSpec(mode="closed", concurrency=1),
                  cache_state="cold")
    finally:
        run_sync(t.stop)
    assert len(restarts) == 1 and all(r.success for r in res.records)
    assert res.target["server"] == {"command": ["fake"]}
    with pytest.raises(NotImplementedError, match="no ServerProcess"):
        run_sync(OpenAITarget(url, MODEL).restart)
