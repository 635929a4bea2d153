"""RequestOutput / CompletionOutput (vLLM's shapes) with per-request engine timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.engine.request import Request


@dataclass
class RequestMetrics:
    """Engine-side timestamps in time.perf_counter() seconds."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0

    @property
    def time_to_first_token_s(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def queue_time_s(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def e2e_s(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time

    @classmethod
    def from_request(cls, req: Request) -> RequestMetrics:
        t = req.times
        return cls(
            arrival_time=t.arrival,
            first_scheduled_time=t.first_scheduled,
            first_token_time=t.first_token,
            finished_time=t.finished,
            token_times=list(t.token_times),
            num_cached_tokens=max(req.num_cached_tokens, 0),
            num_preemptions=req.num_preemptions,
        )


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | None = None
    metrics: RequestMetrics | None = None
    error: str | None = None  # why the engine failed this sequence (finish_reason "error")


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None  # of the first sequence (index 0)

    @property
    def num_cached_tokens(self) -> int:
        return self.metrics.num_cached_tokens if self.metrics else 0
