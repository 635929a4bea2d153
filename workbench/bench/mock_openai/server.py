"""The mock OpenAI server itself: connections, routes and the token streams, on the running
asyncio loop (`await MockServer(config).start()`, then `port`; `await stop()`).

Place in the flow: `mock_openai` runs it as a program (or on a thread: `serve_in_thread`);
each connection reads requests (`http`), each completions / chat request becomes
a `generation.Generation` whose events are written one HTTP chunk each.

    POST /v1/completions, /v1/chat/completions   streamed or not (generation)
    GET  /v1/models      the one served model    GET  /health              200, empty
    GET  /metrics        vLLM-named counters     POST /reset_prefix_cache  200, empty

With `token_delay_s` > 0 a stream sleeps between tokens; at 0 it only yields to the event
loop, so concurrent streams interleave the way an engine's steps emit them. `x-request-id`
is echoed. A malformed request is answered 400 (411 for a chunked body) and its connection
closed; unknown paths 404, known paths with another method 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from workbench.bench.mock_openai.generation import Generation, MockConfig, OpenAIRequestError
from workbench.bench.mock_openai.http import (
    REASONS,
    HttpRequest,
    read_request,
    response_head,
    send,
)

ROUTES = ("/health", "/v1/models", "/metrics", "/reset_prefix_cache", "/v1/completions",
          "/v1/chat/completions")


class MockServer:
    """The server on the running event loop: `await start()` (then `port`), `await stop()`."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.port: int | None = None
        self.created = int(time.time())
        self.counters = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.running = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._next_id = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._connection, self.config.host,
                                                  self.config.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening and end the open connections (a stream in flight is cut)."""
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while (req := await read_request(reader)) is not None:
                await self._route(req, writer)
                if not req.keep_alive:
                    break
        except (ValueError, LookupError) as e:  # malformed: answer, then close
            status = 411 if isinstance(e, LookupError) else 400
            with contextlib.suppress(ConnectionError):
                await send(writer, status, OpenAIRequestError(status, str(e)).body(), False)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away, or sent a head over the reader's limit
        except asyncio.CancelledError:
            pass  # stop(): ends here (asyncio's stream callback would log a re-raise)
        finally:
            self._connections.discard(task)
            writer.close()

    async def _route(self, req: HttpRequest, w: asyncio.StreamWriter) -> None:
        path, keep = req.path.split("?", 1)[0], req.keep_alive
        route = (req.method, path)
        if route == ("GET", "/health") or route == ("POST", "/reset_prefix_cache"):
            await send(w, 200, None, keep)
        elif route == ("GET", "/v1/models"):
            await send(w, 200, self.models(), keep)
        elif route == ("GET", "/metrics"):
            await send(w, 200, self.metrics(), keep)
        elif req.method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self._generate(req, w, chat=path == "/v1/chat/completions")
        else:
            status = 405 if path in ROUTES else 404
            await send(w, status, {"detail": REASONS[status]}, keep)

    def models(self) -> dict[str, Any]:
        m = self.config.model
        return {"object": "list", "data": [{
            "id": m, "object": "model", "created": self.created, "owned_by": "workbench-mock",
            "root": m, "parent": None, "max_model_len": self.config.max_model_len}]}

    def metrics(self) -> str:
        c, label = self.counters, f'model_name="{self.config.model}"'
        return (f"vllm:num_requests_running{{{label}}} {self.running}\n"
                f"vllm:num_requests_waiting{{{label}}} 0\n"
                f"vllm:prompt_tokens_total{{{label}}} {c['prompt_tokens']}\n"
                f"vllm:generation_tokens_total{{{label}}} {c['generation_tokens']}\n"
                f"vllm:request_success_total{{{label}}} {c['requests']}\n")

    async def _generate(self, req: HttpRequest, w: asyncio.StreamWriter, chat: bool) -> None:
        cfg = self.config
        try:
            gen = Generation.parse(req.body, chat, cfg)
        except OpenAIRequestError as e:
            await send(w, e.status, e.body(), req.keep_alive)
            return
        self._next_id += 1
        rid = req.headers.get("x-request-id") or f"{self._next_id:016x}"
        echo = {"x-request-id": rid} if "x-request-id" in req.headers else {}
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": cfg.model}
        self.running += 1
        try:
            if not gen.stream:
                await asyncio.sleep(cfg.token_delay_s * gen.num_tokens)
                await send(w, 200, gen.full_response(head, chat), req.keep_alive, echo)
            else:
                w.write(response_head(200, "text/event-stream; charset=utf-8",
                                      req.keep_alive, None, echo))
                for event, is_token in gen.events(head, chat):
                    w.write(b"%x\r\n%b\r\n" % (len(event), event))  # one HTTP chunk
                    await w.drain()
                    await asyncio.sleep(cfg.token_delay_s if is_token else 0)
                w.write(b"0\r\n\r\n")
                await w.drain()
        finally:
            self.running -= 1
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += gen.prompt_tokens
        self.counters["generation_tokens"] += gen.num_tokens
