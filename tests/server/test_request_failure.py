"""A request the engine fails alone (finish_reason "error") is a 500 for that request only, or one
SSE error event and `[DONE]` on its own stream; another client's stream, batched in the very
same engine steps, gets exactly the tokens of a clean run; /metrics counts the failures as
vllm:request_success_total{finished_reason="error"}."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.server.conftest import ServerHandle, make_app, start_server, stop_server

BYSTANDER = {"prompt": "the bystander keeps streaming", "max_tokens": 120, "temperature": 0,
             "ignore_eos": True, "return_token_ids": True}
FAILING = {"prompt": "this one fails", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
MESSAGE = ("the engine failed this request: engine step failed: RuntimeError: injected failure "
           "of fail-me")


def _hold_engine(s: ServerHandle) -> threading.Event:
    """Park the engine loop between two steps until the returned event is set."""
    gate, parked = threading.Event(), threading.Event()

    def park(_: Any) -> None:
        parked.set()
        gate.wait(60)

    s.engine.submit(park)
    assert parked.wait(30)
    return gate


def _wait_in_flight(s: ServerHandle, n: int) -> None:
    deadline = time.monotonic() + 30
    while s.engine.num_in_flight() < n:
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.01)


def test_a_request_failed_by_the_engine_fails_alone(model_dir: Path) -> None:
    s = start_server(make_app(model_dir))
    url = f"{s.base_url}/v1/completions"
    try:
        clean = httpx.post(url, json=BYSTANDER, timeout=120).json()["choices"][0]["token_ids"]
        assert len(clean) == 120
        runner = s.engine.engine.runner
        real = runner.execute_model
        batches: list[int] = []  # sizes of the batches a failing request was part of

        def failing(out: Any, *args: Any, **kwargs: Any) -> Any:
            ids = list(out.num_scheduled_tokens)
            if any(i.startswith("fail-me") for i in ids):
                batches.append(len(ids))
                raise RuntimeError("injected failure of fail-me")
            return real(out, *args, **kwargs)

        runner.execute_model = failing  # type: ignore[method-assign]
        before = s.metrics()
        streamed: dict[str, Any] = {"ids": [], "chunks": 0}
        first_chunk = threading.Event()

        def bystander() -> None:
            with httpx.stream("POST", url, json={**BYSTANDER, "stream": True}, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        choice = json.loads(line[6:])["choices"][0]
                        streamed["ids"] += choice["token_ids"]
                        streamed["finish"] = choice["finish_reason"]
                        first_chunk.set()
                    elif line == "data: [DONE]":
                        streamed["done"] = True

        t = threading.Thread(target=bystander)
        t.start()
        assert first_chunk.wait(60)

        # 1. non-streaming: its prefill is batched with the bystander's decode step
        gate = _hold_engine(s)
        result: dict[str, httpx.Response] = {}
        worker = threading.Thread(target=lambda: result.update(r=httpx.post(
            url, json=FAILING, headers={"x-request-id": "fail-me-1"}, timeout=60)))
        worker.start()
        _wait_in_flight(s, 2)
        gate.set()
        worker.join(60)
        r = result["r"]
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json() == {"error": {"message": MESSAGE, "type": "InternalServerError",
                                      "param": None, "code": 500}}

        # 2. streaming: one error event, then [DONE]
        gate = _hold_engine(s)
        lines: list[str] = []

        def failing_stream() -> None:
            with httpx.stream("POST", url, json={**FAILING, "stream": True},
                              headers={"x-request-id": "fail-me-2"}, timeout=60) as resp:
                assert resp.status_code == 200
                lines.extend(ln for ln in resp.iter_lines() if ln)

        worker = threading.Thread(target=failing_stream)
        worker.start()
        _wait_in_flight(s, 2)
        gate.set()
        worker.join(60)
        assert lines == ["data: " + json.dumps({"error": {
            "message": MESSAGE, "type": "InternalServerError", "param": None, "code": 500}},
            separators=(",", ":")), "data: [DONE]"]

        t.join(120)
        assert batches == [2, 1, 2, 1]  # batched with the bystander, then alone (one by one)
        assert streamed["ids"] == clean and streamed["finish"] == "length" and streamed["done"]
        after = s.metrics()
        delta = {k: after[k] - before[k] for k in before if "request_success_total" in k}
        assert delta == {"vllm:request_success_total{finished_reason=error}": 2,
                         "vllm:request_success_total{finished_reason=length}": 1,
                         "vllm:request_success_total{finished_reason=stop}": 0,
                         "vllm:request_success_total{finished_reason=abort}": 0}
        s.wait_idle()
        assert httpx.get(f"{s.base_url}/health").json() == {"status": "ready"}
    finally:
        stop_server(s)
