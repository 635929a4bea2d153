"""A mock OpenAI-compatible server that streams tokens as fast as it can: the system under test
when the load generator itself is measured (`workbench bench client-capacity`).

    python -m workbench.bench.mock_openai --port 8011 [--host 127.0.0.1] [--model mock]
        [--token-delay-s 0] [--eos-after N] [--default-max-tokens 16] [--cpu C]

No model runs. Endpoints, in vLLM's shapes (`serving_completion.py`, `serving_chat.py`):

    POST /v1/completions        stream: one `data:` event per token, {"id", "object":
    POST /v1/chat/completions     "text_completion" | "chat.completion.chunk", "created", "model",
                                  "choices": [{"index": 0, "text" | "delta", "logprobs",
                                  "finish_reason", ...}]}; chat opens with a role chunk (delta
                                  {"role": "assistant", "content": ""}); the last token's choice
                                  carries finish_reason; `stream_options.include_usage` adds a
                                  final chunk with "choices": [] and "usage" {prompt_tokens,
                                  total_tokens, completion_tokens} (`continuous_usage_stats`:
                                  usage in every chunk too); then `data: [DONE]`.
                                  Not streamed: one JSON body with the same usage.
    GET  /v1/models             the one served model     GET  /health              200, empty
    GET  /metrics               vLLM-named counters      POST /reset_prefix_cache  200, empty

Tokens: token i (from 0) is the text " t<i>". A prompt's tokens are its token ids (a list of
ints) or its whitespace-separated words (a text prompt, the text of chat messages). The
limit (`max_tokens`; chat: `max_completion_tokens`, else `max_tokens`; else
`default_max_tokens`) is honoured exactly; with `eos_after` set the "model" emits EOS after
that many tokens (finish_reason "stop") unless the request sets `ignore_eos`. With
`token_delay_s` > 0 the stream sleeps between tokens; at 0 it only yields to the event loop,
so concurrent streams interleave the way an engine's steps emit them. `x-request-id` is
echoed. Refusals are 400 / 404 with vLLM's {"error": {"message", "type", "param", "code"}}.

HTTP: a minimal HTTP/1.1 server on asyncio streams (stdlib only, so the mock spends less CPU
per token than the clients it measures): keep-alive, Content-Length bodies, chunked streamed
responses; no TLS, no pipelining, no chunked request bodies. Binds 127.0.0.1 by default.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           411: "Length Required"}
ROUTES = ("/health", "/v1/models", "/metrics", "/reset_prefix_cache", "/v1/completions",
          "/v1/chat/completions")


@dataclass(frozen=True)
class MockConfig:
    host: str = "127.0.0.1"  # the address to bind; 127.0.0.1 keeps the mock off the network
    port: int = 8000  # 0: any free port (MockServer.port says which)
    model: str = "mock"  # the one served model name
    token_delay_s: float = 0.0  # sleep between tokens; 0 = as fast as the loop allows
    eos_after: int | None = None  # emit EOS after this many tokens (unless ignore_eos)
    default_max_tokens: int = 16  # when a request names no limit (vLLM's completions default)
    max_model_len: int = 4096  # reported by /v1/models only

    def __post_init__(self) -> None:
        if _bad_int(self.port, 0) or self.port > 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {self.port!r}")
        if isinstance(self.token_delay_s, bool) or not isinstance(
                self.token_delay_s, int | float) or not 0 <= self.token_delay_s < 60:
            raise ValueError(f"token_delay_s must be seconds in [0, 60), got "
                             f"{self.token_delay_s!r}")
        for name in ("default_max_tokens", "max_model_len"):
            if _bad_int(getattr(self, name), 1):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.eos_after is not None and _bad_int(self.eos_after, 1):
            raise ValueError(f"eos_after must be an integer >= 1 or None, got "
                             f"{self.eos_after!r}")
        if not self.model:
            raise ValueError("model must be a non-empty served model name")


def _bad_int(value: object, low: int) -> bool:
    return isinstance(value, bool) or not isinstance(value, int) or value < low


# --------------------------------------------------------------------------- one request
class OpenAIRequestError(Exception):
    """A refused request: HTTP status and vLLM's error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def body(self) -> dict[str, Any]:
        kind = "NotFoundError" if self.status == 404 else "BadRequestError"
        return {"error": {"message": str(self), "type": kind, "param": None,
                          "code": self.status}}


def _words(content: Any) -> int:
    """Tokens of a chat message's content: a string, or a list of {"type": "text"} parts."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
    return 0


@dataclass(frozen=True)
class Generation:
    """What one request gets: its token counts, how it ends and how it is sent."""

    stream: bool
    prompt_tokens: int
    num_tokens: int
    finish_reason: str  # "length" | "stop"
    include_usage: bool
    continuous_usage: bool

    @classmethod
    def parse(cls, raw: bytes, chat: bool, config: MockConfig) -> Generation:
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OpenAIRequestError(400, f"the request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise OpenAIRequestError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, config.model):
            raise OpenAIRequestError(404, f"The model `{body['model']}` does not exist.")
        if body.get("n", 1) != 1:
            raise OpenAIRequestError(400, f"n ({body['n']!r}) must be 1 on the mock server")
        limit = body.get("max_completion_tokens") if chat else None
        limit = body.get("max_tokens") if limit is None else limit
        limit = config.default_max_tokens if limit is None else limit
        if _bad_int(limit, 1):
            raise OpenAIRequestError(400, f"max_tokens must be an integer >= 1, got {limit!r}")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise OpenAIRequestError(400, "messages must be a non-empty list")
            prompt = sum(_words(m.get("content")) for m in msgs if isinstance(m, dict))
        else:
            p = body.get("prompt")
            if isinstance(p, list) and all(isinstance(t, int) for t in p) and p:
                prompt = len(p)
            elif isinstance(p, str):
                prompt = len(p.split())
            else:
                raise OpenAIRequestError(400, "prompt must be a string or a non-empty list of "
                                         "token ids (one prompt per request on the mock)")
        eos = config.eos_after
        n = limit if eos is None or body.get("ignore_eos") else min(limit, eos)
        opts = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        return cls(stream=bool(body.get("stream")), prompt_tokens=prompt, num_tokens=n,
                   finish_reason="length" if n == limit else "stop",
                   include_usage=bool(opts.get("include_usage")),
                   continuous_usage=bool(opts.get("continuous_usage_stats")))

    def usage(self, completion: int) -> str:
        p = self.prompt_tokens
        return (f'{{"prompt_tokens":{p},"total_tokens":{p + completion},'
                f'"completion_tokens":{completion}}}')

    def events(self, head: dict[str, Any], chat: bool) -> Iterator[tuple[bytes, bool]]:
        """(one SSE event, is it a token) in order, [DONE] last."""
        pre = json.dumps(head, separators=(",", ":"))[:-1] + ',"choices":['
        cont = self.continuous_usage
        if chat:
            usage = f',"usage":{self.usage(0)}' if cont else ""
            yield (f'data: {pre}{{"index":0,"delta":{{"role":"assistant","content":""}},'
                   f'"logprobs":null,"finish_reason":null}}]{usage}}}\n\n').encode(), False
        last = self.num_tokens - 1
        for i in range(self.num_tokens):
            fr = f'"{self.finish_reason}"' if i == last else "null"
            if chat:
                usage = f',"usage":{self.usage(i + 1)}' if cont else ""
                text = (f'{pre}{{"index":0,"delta":{{"content":" t{i}"}},"logprobs":null,'
                        f'"finish_reason":{fr}}}]{usage}}}')
            else:
                usage = self.usage(i + 1) if cont else "null"
                text = (f'{pre}{{"index":0,"text":" t{i}","logprobs":null,"finish_reason":{fr},'
                        f'"stop_reason":null}}],"usage":{usage}}}')
            yield f"data: {text}\n\n".encode(), True
        if self.include_usage:
            yield f'data: {pre}],"usage":{self.usage(self.num_tokens)}}}\n\n'.encode(), False
        yield b"data: [DONE]\n\n", False

    def full_response(self, head: dict[str, Any], chat: bool) -> dict[str, Any]:
        text = "".join(f" t{i}" for i in range(self.num_tokens))
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=self.finish_reason, stop_reason=None)
        obj = "chat.completion" if chat else "text_completion"
        return {**head, "object": obj, "choices": [choice],
                "usage": json.loads(self.usage(self.num_tokens))}


# --------------------------------------------------------------------------- HTTP/1.1
@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    keep_alive: bool


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    """The next request on a connection; None when the client closed it between requests.
    ValueError on a malformed request line or header."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    line, *lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = line.split(" ", 2)
    headers = {}
    for h in lines:
        name, sep, value = h.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {h!r}")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise LookupError("chunked request bodies are not supported: send Content-Length")
    size = int(headers.get("content-length") or 0)
    body = await reader.readexactly(size) if size else b""
    conn = headers.get("connection", "").lower()
    keep = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    return HttpRequest(method, target, headers, body, keep)


def _head(status: int, ctype: str, keep: bool, length: int | None,
          headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"content-type: {ctype}",
             "transfer-encoding: chunked" if length is None else f"content-length: {length}",
             *(f"{k}: {v}" for k, v in headers.items())]
    if not keep:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def send(w: asyncio.StreamWriter, status: int, body: Any, keep: bool,
               headers: dict[str, str] | None = None) -> None:
    """One whole response: None -> empty, str -> text/plain, else JSON."""
    if body is None:
        data, ctype = b"", "application/json"
    elif isinstance(body, str):
        data, ctype = body.encode(), "text/plain; version=0.0.4; charset=utf-8"
    else:
        data, ctype = json.dumps(body).encode(), "application/json"
    w.write(_head(status, ctype, keep, len(data), headers or {}) + data)
    await w.drain()


# --------------------------------------------------------------------------- the server
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
                w.write(_head(200, "text/event-stream; charset=utf-8", req.keep_alive, None,
                              echo))
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


# --------------------------------------------------------------------------- running it
def pin_to_cpus(cpus: Sequence[int]) -> None:
    """Pin every thread of this process (and what it starts later) to `cpus` (Linux
    `sched_setaffinity` per task: with pid 0 it would pin the calling thread only)."""
    target = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, target)


@contextlib.contextmanager
def serve_in_thread(config: MockConfig) -> Iterator[MockServer]:
    """The mock on a daemon thread's own event loop (tests, notebooks); yields the started
    server (`port`), stops it on exit."""
    loop = asyncio.new_event_loop()
    server = MockServer(config)
    thread = threading.Thread(target=loop.run_forever, name="mock-openai", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=30)
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _serve(config: MockConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = MockServer(config)
    port = await server.start()
    print(f"mock OpenAI server on http://{config.host}:{port}/v1 (model {config.model!r}, "
          f"token_delay_s {config.token_delay_s})", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.mock_openai",
                                 description=__doc__.split("\n\n")[0])
    d = MockConfig()
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port, help="0: any free port")
    ap.add_argument("--model", default=d.model, help="the served model name")
    ap.add_argument("--token-delay-s", type=float, default=d.token_delay_s,
                    help="seconds between tokens (0: as fast as possible)")
    ap.add_argument("--eos-after", type=int, default=None,
                    help="emit EOS after this many tokens unless the request sets ignore_eos")
    ap.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    ap.add_argument("--max-model-len", type=int, default=d.max_model_len)
    ap.add_argument("--cpu", type=int, action="append", default=None,
                    help="pin the server to this CPU (repeatable)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config = MockConfig(host=args.host, port=args.port, model=args.model,
                        token_delay_s=args.token_delay_s, eos_after=args.eos_after,
                        default_max_tokens=args.default_max_tokens,
                        max_model_len=args.max_model_len)
    if args.cpu:
        pin_to_cpus(args.cpu)
    asyncio.run(_serve(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
