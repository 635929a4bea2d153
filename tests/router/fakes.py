"""Scripted OpenAI replicas behind an `httpx.MockTransport`, for router tests without servers.

    a, b = FakeReplica("p0"), FakeReplica("d0")
    transport = fake_transport([a, b])         # http://p0, http://d0 -> their handlers
    app = build_router_app(config, url_pool(["http://p0"], ["http://d0"]), tok,
                           transport=transport)

Each replica records what it was sent (`seen`: path, JSON body, X-Request-Id) and answers as
a greedy engine whose token at position p is `100 + p`, so a continuation (prompt + tokens so
far) goes on with the same tokens. A request with `kv_transfer_params.do_remote_decode` is a
prefill: one token and a top-level `kv_transfer_params` (`FakeReplica.kv_params`). A decode
replica ("d...") answers GET /kv_transfer_info with its side channel (`side_channel`; None:
404, as a server without a P2pConnector). Modes:
"ok", "refuse" (ConnectError), "status" (answers `status` with an error body); `break_after`
k: a stream breaks (ReadError) after k token chunks. `clock` advances by `latency_s` per
completion request, so the router's timings are exact.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    request_id: str | None


@dataclass
class FakeReplica:
    name: str
    decode: Callable[[list[int]], str] = lambda ids: "".join(f"<{i}>" for i in ids)
    mode: str = "ok"  # ok | refuse | status
    status: int = 500
    kv_params: dict[str, Any] | None = None  # None: answers null kv_transfer_params
    break_after: int | None = None  # a stream breaks after this many token chunks
    latency_s: float = 0.0
    clock: FakeClock | None = None
    side_channel: tuple[str, int] | None = None  # GET /kv_transfer_info; decode replicas
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.side_channel is None and self.name.startswith("d"):
            self.side_channel = (f"{self.name}-kv", 5700)
        if self.kv_params is None and self.name.startswith("p"):
            self.kv_params = {"do_remote_prefill": True, "do_remote_decode": False,
                              "remote_engine_id": f"engine-{self.name}",
                              "remote_block_ids": [3, 4], "remote_host": self.name,
                              "remote_port": 5600}

    @property
    def url(self) -> str:
        return f"http://{self.name}"

    @property
    def completions(self) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith("completions")]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.mode == "refuse":
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            return httpx.Response(200, text="")
        if path == "/kv_transfer_info":
            self.seen.append(Seen(path, {}, None))
            if self.side_channel is None:
                return httpx.Response(404, json={"error": {"message": "no KV connector"}})
            return httpx.Response(200, json={
                "kv_connector": "P2pConnector", "kv_role": "kv_consumer",
                "engine_id": f"engine-{self.name}", "side_channel_host": self.side_channel[0],
                "side_channel_port": self.side_channel[1], "layerwise": False})
        body = json.loads(request.content)
        self.seen.append(Seen(path, body, request.headers.get("x-request-id")))
        if self.clock is not None:
            self.clock.now += self.latency_s
        if self.mode == "status":
            return httpx.Response(self.status, json={"error": {
                "message": f"{self.name} says {self.status}", "type": "Error", "param": None,
                "code": self.status}})
        prompt = body.get("prompt")
        prompt_len = len(prompt) if isinstance(prompt, list) else 5
        prefill = bool((body.get("kv_transfer_params") or {}).get("do_remote_decode"))
        n = 1 if prefill else int(body.get("max_tokens") or body.get("max_completion_tokens")
                                  or 4)
        ids = [100 + prompt_len + k for k in range(n)]
        chat = path.endswith("chat/completions")
        if body.get("stream"):
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=self._events(ids, chat, body))
        text = self.decode(ids)
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text}}
                                  if chat else {"index": 0, "text": text})
        choice.update(finish_reason="length", stop_reason=None)
        answer = {"id": f"cmpl-{self.name}", "object": "chat.completion" if chat
                  else "text_completion", "created": 1, "model": "m", "choices": [choice],
                  "usage": {"prompt_tokens": prompt_len, "completion_tokens": len(ids),
                            "total_tokens": prompt_len + len(ids)}}
        if prefill:
            answer["kv_transfer_params"] = self.kv_params
        return httpx.Response(200, json=answer)

    async def _events(self, ids: list[int], chat: bool, body: dict[str, Any]
                      ) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        for k, token in enumerate(ids):
            if self.break_after is not None and k == self.break_after:
                raise httpx.ReadError("connection reset by peer")
            text = self.decode([token])
            choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}} if chat
                                      else {"index": 0, "text": text})
            choice.update(logprobs=None, stop_reason=None, token_ids=[token],
                          finish_reason="length" if k == len(ids) - 1 else None)
            yield _sse({"id": f"cmpl-{self.name}", "object": kind, "created": 1, "model": "m",
                        "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _sse({"id": f"cmpl-{self.name}", "object": kind, "created": 1, "model": "m",
                        "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(ids),
                                                 "total_tokens": 3 + len(ids)}})
        yield b"data: [DONE]\n\n"


def _sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def fake_transport(replicas: list[FakeReplica]) -> httpx.MockTransport:
    by_host = {r.name: r for r in replicas}

    async def handler(request: httpx.Request) -> httpx.Response:
        return await by_host[request.url.host].handle(request)

    return httpx.MockTransport(handler)
