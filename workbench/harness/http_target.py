"""The HTTP target: any OpenAI-compatible server (vLLM, SGLang, `workbench serve`) over SSE.

Place in the flow: `runner.run_benchmark` drives it like `InProcessTarget`; each request is
one streamed POST to /v1/completions (or /v1/chat/completions) and fills its
`RequestRecord` the way vLLM's `async_request_openai_completions` does:

    payload  model, prompt (token ids by default, vLLM accepts `prompt: [ids]`, or text),
             max_tokens (chat: max_completion_tokens), temperature, stream: true,
             stream_options: {include_usage: true}, ignore_eos (vLLM extension) if asked;
             header x-request-id = the BenchRequest id (vLLM echoes it back)
    reading  `http_stream.stream_completion` (aiohttp) and `sse.StreamParser`: TTFT at the
             first event with `choices`, one ITL gap per later one, output_tokens from
             `usage`, end_s at the last token event, server durations from the event that
             carries them (`workbench serve`'s final chunk)
    server   `server_snapshot()` is a /metrics scrape (prom.parse), before and after a run

All network I/O runs on the target's own event-loop thread (like the in-process engine's
stepping thread), so timestamps are taken at arrival whatever the caller's loop does, and one
target serves any number of `run()` calls. That loop is `read_loop`: the runner watches its
lag during a measured run (`loop_lag`), so a client that falls behind reading is flagged. A
Poller on that loop scrapes /metrics every `poll_interval_s` from start() to stop();
`server_series()` is the slice of the measured run. Failures (HTTP status, an error event, a
timeout, no token) become success=False with the reason; the run goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from workbench.harness import prom
from workbench.harness.http_stream import new_session, stream_completion
from workbench.harness.metrics import RequestRecord
from workbench.harness.targets import Target
from workbench.harness.workloads import BenchRequest

logger = logging.getLogger(__name__)
T = TypeVar("T")

ENDPOINTS = {"completions": "/completions", "chat": "/chat/completions"}
PROMPT_MODES = ("auto", "token_ids", "text")


class _IOLoop:
    """An asyncio loop on a daemon thread; coroutines are submitted from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="http-target-io",
                                       daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class OpenAITarget(Target):
    """An OpenAI-compatible server at `base_url` (".../v1") serving `model`."""

    def __init__(
        self, base_url: str, model: str | None = None, api_key: str | None = None,
        endpoint: str = "completions", temperature: float = 0.0, ignore_eos: bool = True,
        timeout_s: float = 600.0, prompt_mode: str = "auto",
        continuous_usage_stats: bool = False, extra_body: dict[str, Any] | None = None,
        poll_interval_s: float | None = 1.0, metrics_model: str | None = None,
        server: Any = None, engine_config: dict[str, Any] | None = None,
    ) -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint ({endpoint!r}) must be one of {list(ENDPOINTS)}")
        if prompt_mode not in PROMPT_MODES:
            raise ValueError(f"prompt_mode ({prompt_mode!r}) must be one of {list(PROMPT_MODES)}")
        if endpoint == "chat" and prompt_mode == "token_ids":
            raise ValueError("the chat endpoint takes text, not token ids: prompt_mode='text'")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s ({timeout_s}) must be > 0 seconds")
        self.base_url = base_url.rstrip("/")
        self.root = prom.root_url(self.base_url)
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.endpoint, self.prompt_mode = endpoint, prompt_mode
        self.temperature, self.ignore_eos, self.timeout_s = temperature, ignore_eos, timeout_s
        self.continuous_usage_stats = continuous_usage_stats
        self.extra_body = dict(extra_body or {})
        self.poll_interval_s = poll_interval_s
        self.metrics_model = metrics_model
        self.server = server  # a ServerProcess: lets restart() give the "cold" cache state
        self.engine_config = dict(engine_config or {})
        self.served_models: list[dict[str, Any]] = []
        self.responses: dict[str, dict[str, Any]] = {}  # request id -> what the server said
        self.poller: prom.Poller | None = None
        self._io: _IOLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_snapshot_wall: float | None = None
        self._warned_id = False
        self.t0 = time.perf_counter()

    # ---------------------------------------------------------------- lifecycle
    async def _on_io(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._io is None:
            raise RuntimeError("OpenAITarget is not started; await target.start() first")
        return await asyncio.wrap_future(self._io.submit(coro))

    async def start(self) -> None:
        if self._io is None:
            self._io = _IOLoop()
            try:
                await self._on_io(self._astart())
            except BaseException:
                await self.stop()
                raise

    async def stop(self) -> None:
        io, self._io = self._io, None
        if io is not None:
            await asyncio.wrap_future(io.submit(self._astop()))
            await asyncio.to_thread(io.close)

    async def restart(self) -> None:
        if self.server is None:
            raise NotImplementedError("this OpenAITarget has no ServerProcess to restart "
                                      "(the 'cold' cache state needs the server's command)")
        await self.stop()
        await asyncio.to_thread(self.server.restart)
        await self.start()

    @property
    def read_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this target reads its responses on (None when not started): the
        runner watches its lag over a measured run (`loop_lag.watch_read_loop`)."""
        return self._io.loop if self._io is not None else None

    async def _request(self, method: str, url: str, timeout_s: float) -> tuple[int, bytes]:
        """One small request on the target's session: (status, body)."""
        assert self._session is not None
        async with self._session.request(
                method, url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return resp.status, await resp.read()

    async def _astart(self) -> None:
        self._session = new_session(self.api_key, self.timeout_s)
        try:
            status, data = await self._request("GET", self.base_url + "/models", 30.0)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise RuntimeError(f"no OpenAI-compatible server at {self.base_url}: "
                               f"{type(e).__name__}: {e}") from e
        if status in (401, 403):
            raise RuntimeError(f"{self.base_url}/models answered {status}: pass "
                               "api_key (or set OPENAI_API_KEY) for this server")
        if status == 200:
            self.served_models = list(json.loads(data).get("data") or [])
            self._resolve_model([str(m.get("id")) for m in self.served_models])
        if self.model is None:
            raise ValueError(f"model is None and {self.base_url}/models did not name one")
        if self.poll_interval_s:
            self.poller = prom.Poller(prom.metrics_url(self.base_url), self.poll_interval_s,
                                      model=self.metrics_model).start()

    def _resolve_model(self, ids: list[str]) -> None:
        """None, "bundled" or a folder path matching the one served model -> its served name."""
        if self.model in ids or not ids:
            return
        same_dir = self.model is not None and Path(self.model).is_dir() and len(ids) == 1 and (
            Path(ids[0]).is_dir() and Path(ids[0]).resolve() == Path(self.model).resolve())
        if len(ids) == 1 and (self.model in (None, "bundled") or same_dir):
            self.model = ids[0]
            return
        raise ValueError(f"model {self.model!r} is not served at {self.base_url}; "
                         f"it serves {ids}")

    async def _astop(self) -> None:
        if self.poller is not None:
            await self.poller.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ---------------------------------------------------------------- requests
    def payload(self, req: BenchRequest) -> dict[str, Any]:
        """The JSON body of one request (see the module docstring)."""
        mode = self.prompt_mode
        if mode == "auto":
            ids_ok = self.endpoint == "completions" and bool(req.prompt_token_ids)
            mode = "token_ids" if ids_ok else "text"
        if mode == "text" and req.prompt is None:
            raise ValueError(f"request {req.request_id} has no prompt text (prompt_mode='text'"
                             " or the chat endpoint); use token ids on /v1/completions")
        body: dict[str, Any] = {"model": self.model, "temperature": self.temperature,
                                "stream": True, "stream_options": {"include_usage": True}}
        if self.continuous_usage_stats:
            body["stream_options"]["continuous_usage_stats"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
            body["max_completion_tokens"] = req.max_tokens
        else:
            body["prompt"] = list(req.prompt_token_ids) if mode == "token_ids" else req.prompt
            body["max_tokens"] = req.max_tokens
        if self.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.extra_body)
        return body

    async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
        body = self.payload(req)
        if req.prompt_token_ids and "prompt" in body and isinstance(body["prompt"], list):
            record.prompt_tokens = len(req.prompt_token_ids)
        await self._on_io(self._stream(req.request_id, body, record))

    async def _stream(self, rid: str, body: dict[str, Any], record: RequestRecord) -> None:
        assert self._session is not None
        info: dict[str, Any] = self.responses.setdefault(rid, {})
        try:
            await stream_completion(self._session, self.base_url + ENDPOINTS[self.endpoint],
                                    body, rid, record, info, chat=self.endpoint == "chat",
                                    now_s=self.now_s, timeout_s=self.timeout_s)
        finally:
            self._check_echo(rid, info.get("x_request_id"))

    def _check_echo(self, rid: str, echoed: str | None) -> None:
        if echoed is not None and echoed != rid and not self._warned_id:
            self._warned_id = True
            logger.warning("server answered x-request-id %r for %r: it does not keep request "
                           "ids, the client/server join uses the client's", echoed, rid)

    # ---------------------------------------------------------------- server side
    async def reset_prefix_cache(self) -> bool:
        """POST /reset_prefix_cache?reset_external=true (vLLM, dev mode: the KV connector's
        tiers too; workbench serve), else /flush_cache (SGLang)."""
        return await self._on_io(self._areset())

    async def _areset(self) -> bool:
        for path in ("/reset_prefix_cache?reset_external=true", "/flush_cache"):
            try:
                status, data = await self._request("POST", self.root + path, 30.0)
            except (aiohttp.ClientError, TimeoutError) as e:
                logger.warning("POST %s failed: %s", self.root + path, e)
                return False
            if status == 200:  # workbench serve: {"success": false} when it could not
                try:
                    return bool(json.loads(data).get("success", True))
                except (ValueError, AttributeError):
                    return True  # vLLM: an empty 200
            if status not in (404, 405):
                return False
        return False

    async def _ascrape(self) -> dict[str, float]:
        url = prom.metrics_url(self.base_url)
        status, data = await self._request("GET", url, 5.0)
        if status != 200:
            raise ValueError(f"GET {url} answered HTTP {status}")
        return prom.parse(data.decode("utf-8", "replace"), model=self.metrics_model)

    def server_snapshot(self) -> dict[str, Any]:
        """One /metrics scrape, flat (prom.parse); {} when the server has none."""
        if self._io is None or self._session is None:
            return {}
        self._last_snapshot_wall = time.perf_counter()
        fut = self._io.submit(self._ascrape())
        try:
            return fut.result(timeout=30.0)
        except (aiohttp.ClientError, ValueError, TimeoutError) as e:
            logger.warning("scraping %s failed: %s", prom.metrics_url(self.base_url), e)
            return {}

    def step_trace(self) -> list[dict[str, Any]]:
        return []  # an HTTP server exposes no per-step rows; see server_series()

    def server_series(self) -> list[dict[str, Any]]:
        """Poller rows of the measured run: from t0 to the last server_snapshot() (the
        runner's `server_after`), t_s relative to t0, steps renumbered from 0."""
        rows = list(self.poller.rows) if self.poller is not None else []
        end = self._last_snapshot_wall
        if end is None or end <= self.t0:
            end = float("inf")
        out = [r for r in rows if self.t0 <= r["wall_time_s"] <= end]
        return [{**r, "step": i, "t_s": r["wall_time_s"] - self.t0} for i, r in enumerate(out)]

    def server_rows(self) -> list[dict[str, Any]]:
        """Per request what the server itself reported (ids as echoed), for join.py."""
        return [{"request_id": rid, "x_request_id": i.get("x_request_id"),
                 "response_id": i.get("id"), "finish_reason": i.get("finish_reason"),
                 **i.get("server", {})} for rid, i in self.responses.items()]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "http", "model": self.model, "base_url": self.base_url,
            "endpoint": self.endpoint,
            "config": {**self.engine_config, "temperature": self.temperature,
                       "ignore_eos": self.ignore_eos, "prompt_mode": self.prompt_mode},
            "served_models": self.served_models,
        }
        if self.poller is not None:
            out["poller"] = {"interval_s": self.poll_interval_s, "rows": len(self.poller.rows),
                             "errors": self.poller.errors}
        if self.server is not None:
            out["server"] = self.server.describe()
        return out

