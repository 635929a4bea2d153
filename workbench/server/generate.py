"""Generation: one HTTP request's engine requests, their streams merged into text deltas.

Place in the flow: `openai_routes` builds validated engine `Request`s (one per prompt, each
with `n` sequences), then iterates `Generation.deltas()`; each `Delta` is one choice's new
text (and token ids), the last one with `finished=True` and the choice's finish reason.

    AsyncEngine.add_request(req_i) -> RequestStream_i --pump task--> queue --> deltas()
    choice index = prompt index * n + sequence index (vLLM's numbering)

Stop strings: the text is cut before the stop string and the sequence aborted in the engine;
its finish chunk follows when the engine confirms the abort (one step later) with
finish_reason "stop" and stop_reason the string. `abort()` (client gone, or the consumer
stopped early) aborts every unfinished request; the engine frees their blocks.

A sequence the engine failed alone ends with finish_reason "error" and `SeqOutput.error` (the
engine's message); the route answers 500 (JSON) or one SSE error event, while the engine's
other requests go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from workbench.core.request import Request, RequestTimes
from workbench.engine.async_engine import AsyncEngine, AsyncEngineError, RequestStream
from workbench.entrypoints.openai.protocol.detokenizer import (
    IncrementalDetokenizer,
    StopStringChecker,
)
from workbench.server.metrics import ServerMetrics


@dataclass
class SeqOutput:
    """One choice: what has been released to the client so far."""

    index: int
    prompt_index: int
    num_prompt_tokens: int
    detok: IncrementalDetokenizer
    stops: StopStringChecker
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    times: RequestTimes | None = None
    num_cached_tokens: int = -1
    error: str | None = None  # why the engine failed this sequence (finish_reason "error")
    kv_transfer_params: dict[str, Any] | None = None  # a prefill leg's handshake
    done: bool = False  # no more text (stop string seen or engine finished)
    finished: bool = False  # the engine's last event for it was consumed


@dataclass
class Delta:
    seq: SeqOutput
    text: str
    token_ids: list[int]
    finished: bool


_END = object()


class Generation:
    def __init__(
        self, engine: AsyncEngine, tokenizer: Any, requests: list[Request], n: int,
        stop: list[str], skip_special_tokens: bool, metrics: ServerMetrics | None = None,
    ) -> None:
        self.engine = engine
        self.requests = requests
        self.n = n
        self.metrics = metrics
        self.seqs = [
            SeqOutput(
                index=p * n + i, prompt_index=p, num_prompt_tokens=req.num_prompt_tokens,
                detok=IncrementalDetokenizer(tokenizer, skip_special_tokens),
                stops=StopStringChecker(stop),
            )
            for p, req in enumerate(requests) for i in range(n)
        ]
        self._open: set[int] = set()  # prompt indexes whose stream has not ended
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._aborted = False

    @property
    def single(self) -> bool:
        return len(self.seqs) == 1

    def start(self) -> None:
        """Hand the requests to the engine (call inside the running loop, before deltas()).

        Raises AsyncEngineError when the engine loop is not serving (requests already added
        are aborted).
        """
        assert not self._started, "start() is called once"
        self._started = True
        try:
            for p, req in enumerate(self.requests):
                stream = self.engine.add_request(req)
                self._open.add(p)
                self._tasks.append(asyncio.create_task(_pump(p, stream, self._queue)))
        except BaseException:
            self.abort()
            raise

    async def deltas(self) -> AsyncIterator[Delta]:
        """Yield deltas until every sequence finished; AsyncEngineError if the engine failed."""
        if not self._started:
            self.start()
        try:
            while self._open:
                item = await self._queue.get()
                if isinstance(item, tuple) and item[1] is _END:
                    self._open.discard(item[0])
                    continue
                if isinstance(item, AsyncEngineError):
                    self.abort("error")
                    raise item
                delta = self._apply(*item)
                if delta is not None:
                    yield delta
        finally:
            self.abort()

    def abort(self, reason: str = "abort") -> None:
        """Abort unfinished engine requests and stop the pumps (idempotent).

        Unfinished sequences are counted with `reason` ("abort", or "error" when the engine
        failed them); a sequence already cut by a stop string counts as "stop".
        """
        if self._aborted:
            return
        self._aborted = True
        for t in self._tasks:
            t.cancel()
        for p in sorted(self._open):
            self.engine.abort(self.requests[p].request_id)
        for seq in self.seqs:
            if not seq.finished:
                seq.finished = seq.done = True
                seq.finish_reason = seq.finish_reason or reason
                if self.metrics is not None:
                    self.metrics.count_finished(seq.finish_reason)

    def _apply(self, p: int, ev: Any) -> Delta | None:
        seq = self.seqs[p * self.n + ev.index]
        if seq.finished:
            return None
        if ev.finished:
            seq.finished = True
            seq.times = ev.times
            seq.num_cached_tokens = ev.num_cached_tokens
            seq.kv_transfer_params = ev.kv_transfer_params
        if seq.done:  # a stop string ended it; this is the engine's abort confirmation
            if ev.finished:
                self._observe(seq)
                return Delta(seq, "", [], finished=True)
            return None
        new_ids = list(ev.token_ids)
        seq.token_ids.extend(new_ids)
        text = seq.detok.add(new_ids)
        if ev.finished:
            text += seq.detok.flush()
        text, hit = seq.stops.feed(text, final=ev.finished)
        seq.text += text
        if hit is not None:
            seq.done = True
            seq.finish_reason, seq.stop_reason = "stop", hit
            if not ev.finished:
                self.engine.abort(ev.request_id)
        elif ev.finished:
            seq.done = True
            seq.finish_reason = ev.finish_reason
            if ev.finish_reason == "error":  # the engine failed this request alone
                seq.error = ev.error or "the engine failed this request"
            params = self.requests[p].sampling_params
            last = seq.token_ids[-1] if seq.token_ids else None
            if ev.finish_reason == "stop" and last in params.stop_token_ids:
                seq.stop_reason = last
        if ev.finished:
            self._observe(seq)
        return Delta(seq, text, new_ids, finished=ev.finished)

    def _observe(self, seq: SeqOutput) -> None:
        if self.metrics is not None:
            self.metrics.observe_finished(
                seq.times, seq.num_prompt_tokens, len(seq.token_ids),
                seq.finish_reason or "abort", first_of_request=seq.index % self.n == 0,
            )


async def _pump(p: int, stream: RequestStream, queue: asyncio.Queue[Any]) -> None:
    try:
        async for ev in stream:
            queue.put_nowait((p, ev))
    except AsyncEngineError as e:
        queue.put_nowait(e)
    finally:
        queue.put_nowait((p, _END))
