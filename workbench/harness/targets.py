"""Benchmark targets: what the runner sends requests to (the in-process engine, later HTTP).

Place in the flow: `runner.run_benchmark` drives one `Target`; the target streams each
`BenchRequest` and fills its `RequestRecord`. Only the `Target` ABC is shared: an
OpenAI-compatible HTTP target plugs in beside `InProcessTarget` without touching the runner
or the metrics.

Clock: every record time is seconds on time.perf_counter relative to `target.t0`, which the
runner sets to the run's start before the first measured request.
"""

from __future__ import annotations

import asyncio
import gc
import time
from abc import ABC, abstractmethod
from typing import Any

from workbench.config import EngineConfig
from workbench.core.request import RequestTimes
from workbench.engine.async_engine import AsyncEngine
from workbench.engine.llm_engine import LLMEngine
from workbench.harness.metrics import RequestRecord
from workbench.harness.workloads import BenchRequest
from workbench.sampling_params import SamplingParams


class Target(ABC):
    """A server under test, driven from one asyncio loop.

    Contract:
    - `start()` makes it ready (idempotent); `stop()` releases it (idempotent).
    - `generate(req, record)` streams one request to completion. The runner has set
      `record.start_s`; the target fills first_token_s, chunk_times_s and chunk_tokens (one
      entry per streamed chunk with content, at its arrival), end_s, output_tokens,
      success/error, and the server_* durations when it knows them. It may raise: the runner
      then marks the record failed with the error. Cancellation must abort the request.
    - `reset_prefix_cache()` drops the server's prefix cache, and a KV connector's external
      tiers (vLLM's `reset_external`); True when it did.
    - `server_snapshot()` is a flat dict of server counters/gauges (vLLM metric names) now;
      `step_trace()` the per-step rows so far ([] when the server does not expose them).
    - `describe()` says what was measured: {"kind", "model", "config", ...}.
    - `t0` (perf_counter seconds) is the run start that record times are relative to.
    """

    t0: float = 0.0

    def now_s(self) -> float:
        """Seconds since `t0` on time.perf_counter."""
        return time.perf_counter() - self.t0

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def generate(self, req: BenchRequest, record: RequestRecord) -> None: ...

    @abstractmethod
    async def reset_prefix_cache(self) -> bool: ...

    async def restart(self) -> None:
        """A fresh server (the "cold" cache state); targets that cannot restart raise."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart (cold cache state)")

    @abstractmethod
    def server_snapshot(self) -> dict[str, Any]: ...

    @abstractmethod
    def step_trace(self) -> list[dict[str, Any]]: ...

    @abstractmethod
    def describe(self) -> dict[str, Any]: ...


class InProcessTarget(Target):
    """The workbench engine in this process: LLMEngine stepped by an AsyncEngine thread."""

    def __init__(
        self,
        model: str,
        engine_kwargs: dict[str, Any] | None = None,
        temperature: float = 0.0,
        ignore_eos: bool = True,
    ) -> None:
        self.model = str(model)
        self.engine_kwargs = dict(engine_kwargs or {})
        self.temperature = temperature
        self.ignore_eos = ignore_eos
        self.engine: AsyncEngine | None = None
        self.t0 = time.perf_counter()
        self.num_starts = 0  # engines built so far (restart() builds a new one)
        self.outputs: dict[str, list[int]] = {}  # request id -> generated token ids (last run)

    # ---------------------------------------------------------------- lifecycle
    def _build(self) -> AsyncEngine:
        config = EngineConfig.from_kwargs(self.model, **self.engine_kwargs)
        return AsyncEngine(LLMEngine(config)).start()

    async def start(self) -> None:
        if self.engine is None:
            self.engine = await asyncio.to_thread(self._build)
            self.num_starts += 1

    async def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.to_thread(engine.stop)
            del engine
            gc.collect()
            _empty_cuda_cache()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    def _require(self) -> AsyncEngine:
        if self.engine is None:
            raise RuntimeError("InProcessTarget is not started; await target.start() first")
        return self.engine

    # ---------------------------------------------------------------- requests
    async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
        ae = self._require()
        params = SamplingParams(
            temperature=self.temperature, max_tokens=req.max_tokens, ignore_eos=self.ignore_eos
        )
        prompt: Any = list(req.prompt_token_ids) if req.prompt_token_ids else req.prompt
        request = ae.engine.make_request(prompt, params, request_id=req.request_id)
        record.prompt_tokens = request.num_prompt_tokens
        stream = ae.add_request(request)
        times: RequestTimes | None = None
        reason: str | None = None
        tokens = self.outputs[req.request_id] = []
        try:
            async for ev in stream:
                now = self.now_s()
                if ev.token_ids:
                    tokens.extend(ev.token_ids)
                    if record.first_token_s is None:
                        record.first_token_s = now
                    record.chunk_times_s.append(now)
                    record.chunk_tokens.append(len(ev.token_ids))
                    record.output_tokens = ev.num_output_tokens
                if ev.finished:
                    times, reason = ev.times, ev.finish_reason
                    record.end_s = now
                    if ev.num_cached_tokens >= 0:
                        record.num_cached_tokens = ev.num_cached_tokens
        except asyncio.CancelledError:
            ae.abort(req.request_id)
            record.success, record.error = False, "cancelled"
            raise
        if times is not None:
            _fill_server_times(record, times)
        record.success = reason in ("stop", "length")
        record.error = None if record.success else f"finished with reason {reason!r}"

    async def reset_prefix_cache(self) -> bool:
        ae = self._require()
        return await asyncio.wrap_future(
            ae.submit(lambda e: e.reset_prefix_cache(reset_connector=True)))

    # ---------------------------------------------------------------- reporting
    def server_snapshot(self) -> dict[str, Any]:
        return self.engine.stats() if self.engine is not None else {}

    def step_trace(self) -> list[dict[str, Any]]:
        return self.engine.step_trace() if self.engine is not None else []

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "in-process",
            "model": self.model,
            "config": {
                **self.engine_kwargs, "temperature": self.temperature,
                "ignore_eos": self.ignore_eos,
            },
        }
        if self.engine is not None:
            out["memory"] = self.engine.memory_readout()
            out["device"] = str(self.engine.config.device)
        return out


def _fill_server_times(record: RequestRecord, t: RequestTimes) -> None:
    """Engine durations: queue, prefill, decode, TTFT and E2E (seconds)."""
    if t.first_scheduled is not None:
        record.server_queue_s = t.first_scheduled - t.arrival
    if t.first_token is not None:
        record.server_ttft_s = t.first_token - t.arrival
        if t.first_scheduled is not None:
            record.server_prefill_s = t.first_token - t.first_scheduled
    if t.finished is not None:
        record.server_e2e_s = t.finished - t.arrival
        if t.first_token is not None:
            record.server_decode_s = t.finished - t.first_token
    if t.kv_load_start is not None and t.kv_load_done is not None:  # read from a prefill
        record.server_kv_wait_s = t.kv_load_done - t.kv_load_start
        record.server_kv_transfer_s = t.kv_transfer_s
        record.server_kv_transfer_bytes = float(t.kv_transfer_bytes)


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
