"""AsyncEngine: an LLMEngine stepped by a background thread, with one token stream per request.

    caller threads / asyncio tasks                 loop thread (the only one touching the engine)
    add_request(req) -> RequestStream ---queue---> add between steps -> engine.step()
    abort(id), submit(fn), reset_prefix_cache() --> run between steps
    async for ev in stream / for ev in stream  <--- StreamEvent per step (token ids + engine times)

Events reach an asyncio consumer through `loop.call_soon_threadsafe` (the loop running where
`add_request` was called) and a plain consumer through a thread-safe queue. The loop thread
sleeps on a condition variable while there is nothing to do.

Failures: the engine's step already keeps a request's failure to that request (its stream
ends with a finished event, finish_reason "error" and `error` set; the other streams go on)
and a failed forward to that step's requests. Only an exception escaping `step()` itself (a
bug in the scheduler) is handled here: it is recorded, ends every in-flight stream with
`AsyncEngineError`, and the loop goes on serving later requests (the requests are aborted
and the prefix cache reset, since their cached blocks may hold KV that was never written).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from workbench.config import EngineConfig
from workbench.core.request import Request, RequestTimes
from workbench.engine.llm_engine import LLMEngine
from workbench.metrics.stats import StepRecord

logger = logging.getLogger(__name__)
T = TypeVar("T")


class AsyncEngineError(RuntimeError):
    """A request could not complete: its step raised, or the engine loop is not serving."""


@dataclass(frozen=True)
class StreamEvent:
    """The new tokens of one sequence after one step (several per step with speculation).

    token_times are the engine's time.perf_counter() stamps, one per token. `finished` marks
    the sequence's last event; `times` (a copy of the engine's Request.times) comes with it.
    """

    request_id: str  # the sequence's id: the request's, or f"{request_id}#{i}" for n > 1
    index: int
    token_ids: tuple[int, ...]
    token_times: tuple[float, ...]
    num_output_tokens: int
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" when finished
    times: RequestTimes | None = None
    num_cached_tokens: int = -1
    # the KV connector's answer when the request finished (a prefill leg's handshake)
    kv_transfer_params: dict[str, Any] | None = None
    error: str | None = None  # why the engine failed this sequence (finish_reason "error")


_END = object()  # stream sentinel after the last event


class RequestStream:
    """Events of one request; iterate with `async for` (asyncio) or `for` (a plain thread).

    Which one is fixed at `AsyncEngine.add_request`: async when it was called inside a running
    asyncio loop, blocking otherwise. Iteration ends after the last sequence's finished event
    and raises AsyncEngineError if the request failed.
    """

    def __init__(
        self, request_id: str, num_seqs: int, loop: asyncio.AbstractEventLoop | None
    ) -> None:
        self.request_id = request_id
        self.loop = loop
        self.error: str | None = None
        self._remaining = num_seqs
        self._sync: queue.Queue[Any] = queue.Queue()
        self._async: asyncio.Queue[Any] | None = asyncio.Queue() if loop is not None else None

    # -- producer side (loop thread) ---------------------------------------------------------
    def _put(self, item: Any) -> None:
        if self.loop is None:
            self._sync.put(item)
            return
        assert self._async is not None
        try:
            self.loop.call_soon_threadsafe(self._async.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening
            pass

    def _push(self, ev: StreamEvent) -> bool:
        """Deliver one event; True when it was the request's last one."""
        self._put(ev)
        if ev.finished:
            self._remaining -= 1
            if self._remaining <= 0:
                self._put(_END)
                return True
        return False

    def _fail(self, message: str) -> None:
        self._put(AsyncEngineError(message))

    # -- consumer side ------------------------------------------------------------------------
    def _check(self, item: Any) -> bool:
        if isinstance(item, AsyncEngineError):
            self.error = str(item)
            raise item
        return item is _END

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._async is None:
            raise TypeError(
                f"stream {self.request_id!r} was created outside an asyncio loop; use `for`"
            )
        while not self._check(item := await self._async.get()):
            yield item

    def __iter__(self) -> Iterator[StreamEvent]:
        if self.loop is not None:
            raise TypeError(
                f"stream {self.request_id!r} was created inside an asyncio loop; use `async for`"
            )
        while not self._check(item := self._sync.get()):
            yield item


class AsyncEngine:
    """Serve an LLMEngine from a background thread.

    Contract: after `start()` only the loop thread touches the engine; every public method is
    thread-safe. Requests, aborts and calls are applied between steps in submission order.
    `stop()` aborts what is in flight (streams end with finish_reason "abort") and joins.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.errors: list[str] = []  # formatted tracebacks of failed steps, oldest first
        self._cond = threading.Condition()
        self._commands: list[tuple[str, Any, Any]] = []
        self._streams: dict[str, RequestStream] = {}  # request id -> stream (under _cond)
        self._sent: dict[str, int] = {}  # sequence id -> output tokens delivered (loop thread)
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ---------------------------------------------------------------- lifecycle
    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> AsyncEngine:
        if self.is_running:
            return self
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="async-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> AsyncEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- public API
    def add_request(self, request: Request) -> RequestStream:
        """Queue a Request (from `engine.make_request`) and return its stream.

        Requests added before the first `start()` wait for it; after `stop()` this raises.
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        stream = RequestStream(request.request_id, request.sampling_params.n, loop)
        with self._cond:
            if request.request_id in self._streams:
                raise ValueError(f"request_id ({request.request_id!r}) is already in flight")
            if self._stopping:
                raise AsyncEngineError("the engine loop is stopped; call start() first")
            self._streams[request.request_id] = stream
            self._commands.append(("add", request, stream))
            self._cond.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op if unknown or done); its stream ends with "abort"."""
        self._command("abort", request_id, None)

    def submit(self, fn: Callable[[LLMEngine], T]) -> Future[T]:
        """Run `fn(engine)` on the loop thread between steps (inline if not started)."""
        fut: Future[T] = Future()
        if not self.is_running:
            _call(fn, self.engine, fut)
        else:
            self._command("call", fn, fut)
        return fut

    def reset_prefix_cache(self, timeout: float | None = None,
                           reset_connector: bool = False) -> bool:
        """Drop the prefix cache between steps (and the KV connector's tiers with
        `reset_connector`); False while any request holds blocks."""
        return self.submit(lambda e: e.reset_prefix_cache(reset_connector)).result(timeout)

    def stats(self) -> dict[str, float]:
        """A copy of the engine's stats (read without pausing the loop)."""
        out = self.engine.stats.snapshot()
        out["num_step_errors"] = len(self.errors)
        return out

    def step_trace(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in list(self.engine.stats.step_trace)]

    def step_records(self) -> tuple[int, list[StepRecord]]:
        """(steps taken so far, the kept step-trace rows, oldest first; the trace is
        bounded, so the rows may be fewer than the steps)."""
        stats = self.engine.stats
        return stats.num_steps, list(stats.step_trace)

    def live_gauges(self) -> Future[dict[str, float]]:
        """vLLM's running / waiting / KV-usage gauges, read between two steps."""
        return self.submit(_live_gauges)

    def memory_readout(self) -> dict[str, Any]:
        """The engine's memory accounting (weights, KV pool, budget; fixed after start-up)."""
        return self.engine.memory_readout()

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def model_runner(self) -> Any:
        """Rank 0's model runner, for diagnostics that time or hook the forward (the
        quantization benchmark's per-layer timing)."""
        return self.engine.runner

    @property
    def num_gpu_blocks(self) -> int:
        """Blocks in the KV pool (vLLM's name)."""
        return self.engine.num_blocks

    def num_in_flight(self) -> int:
        with self._cond:
            return len(self._streams)

    # ---------------------------------------------------------------- loop thread
    def _command(self, kind: str, a: Any, b: Any) -> None:
        with self._cond:
            self._commands.append((kind, a, b))
            self._cond.notify()

    def _loop(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not (self._commands or self._stopping or engine.has_unfinished_requests()):
                    self._cond.wait()
                commands, self._commands = self._commands, []
                stopping = self._stopping
            try:
                for kind, a, b in commands:
                    self._apply(kind, a, b)
                if stopping:
                    with self._cond:
                        ids = list(self._streams)
                    for rid in ids:
                        self._abort(rid)
                    return
                if engine.has_unfinished_requests():
                    for req in engine.step():
                        self._deliver(req)
            except Exception:  # noqa: BLE001 - recorded and sent to every in-flight stream
                self._on_step_error(traceback.format_exc())
                if stopping:
                    return

    def _apply(self, kind: str, a: Any, b: Any) -> None:
        if kind == "add":
            try:
                self.engine.add_request(a)
            except Exception as e:  # noqa: BLE001 - reported to the stream's owner
                self._finish_stream(a.request_id, f"{type(e).__name__}: {e}")
        elif kind == "abort":
            self._abort(a)
        else:
            _call(a, self.engine, b)

    def _deliver(self, req: Request) -> None:
        sid = req.request_id
        sent = self._sent.get(sid, 0)
        done = req.is_finished()
        ev = StreamEvent(
            request_id=sid, index=req.index, token_ids=tuple(req.output_token_ids[sent:]),
            token_times=tuple(req.times.token_times[sent:]),
            num_output_tokens=req.num_output_tokens, finished=done,
            finish_reason=req.status.finish_reason if done else None,
            times=_copy_times(req.times) if done else None,
            num_cached_tokens=req.num_cached_tokens,
            error=req.error if done else None,
            kv_transfer_params=req.kv_transfer_params if done else None,
        )
        self._sent[sid] = req.num_output_tokens
        if done:
            self._sent.pop(sid, None)
        root = req.parent_id or sid
        with self._cond:
            stream = self._streams.get(root)
        if stream is not None and stream._push(ev):
            self._finish_stream(root, None)

    def _abort(self, request_id: str) -> None:
        sched = self.engine.scheduler
        ids = [request_id] + [
            r.request_id for r in list(sched.requests.values()) if r.parent_id == request_id
        ]
        for req in self.engine.abort_request(ids):
            req.times.finished = req.times.finished or time.perf_counter()
            self._deliver(req)
        with self._cond:
            stream = self._streams.get(request_id)
        if stream is not None:  # e.g. a request whose add failed
            stream._put(_END)
            self._finish_stream(request_id, None)

    def _finish_stream(self, request_id: str, error: str | None) -> None:
        with self._cond:
            stream = self._streams.pop(request_id, None)
        if stream is not None and error is not None:
            stream._fail(error)

    def _on_step_error(self, tb: str) -> None:
        self.errors.append(tb)
        last = tb.strip().splitlines()[-1]
        logger.error("engine step failed; failing every in-flight request:\n%s", tb)
        try:
            self.engine.abort_request(list(self.engine.scheduler.requests))
            self.engine.reset_prefix_cache()  # blocks of the failed step may hold unwritten KV
        except Exception:  # noqa: BLE001 - the engine is beyond repair; keep failing requests
            logger.exception("cleanup after a failed step failed too")
        self._sent.clear()
        with self._cond:
            ids = list(self._streams)
        for rid in ids:
            self._finish_stream(rid, f"engine step failed: {last}")


def _live_gauges(engine: LLMEngine) -> dict[str, float]:
    # a scrape takes the KV connector's news first: an idle prefill instance frees (and
    # counts) the blocks decode instances have read since its last step
    engine.poll_kv_transfers()
    sched = engine.scheduler
    return {
        "vllm:num_requests_running": float(len(sched.running)),
        "vllm:num_requests_waiting": float(len(sched.waiting)),
        "vllm:kv_cache_usage_perc": float(sched.kv_cache_manager.usage),
    }


def _call(fn: Callable[[LLMEngine], T], engine: LLMEngine, fut: Future[T]) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn(engine))
    except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
        fut.set_exception(e)


def _copy_times(times: RequestTimes) -> RequestTimes:
    return replace(times, token_times=list(times.token_times))
