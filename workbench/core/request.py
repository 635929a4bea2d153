"""Request: the scheduler's view of a request (Scheduler, KVCacheManager, the engine).

It never leaves the engine process: the workers get what they need of it in the step message
(`SchedulerOutput`'s NewRequestData, once) and keep their own state.

As in vLLM V1 there is no prefill/decode phase flag: the scheduler only gives each request a
number of new tokens, `num_tokens - num_computed_tokens` (plus speculative tokens, later).

    all_token_ids:   | prompt_token_ids ............ | output_token_ids ... |
    num_computed_tokens:  tokens whose KV is in the cache
    spec_token_ids:  draft tokens the worker's proposer made for the next step (not part of
                     all_token_ids; from ModelRunnerOutput); verified next step, then
                     cleared (rejected ones roll back). Their distributions and any draft
                     model's progress stay on the worker.
    prompt_logprobs: runs of prompt logprobs received so far (SamplingParams.prompt_logprobs);
                     `add_prompt_logprobs` keys them by position, so a recompute after
                     preemption adds nothing twice
"""

from __future__ import annotations

import enum
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.sampling_params import SamplingParams

if TYPE_CHECKING:
    from workbench.core.outputs import LogprobsTensors


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    WAITING_FOR_REMOTE_KVS = 3  # its KV is being loaded from an external tier (vLLM's name)
    FINISHED_STOPPED = 4  # EOS or a stop token
    FINISHED_LENGTH_CAPPED = 5  # max_tokens or max_model_len reached
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7  # this request failed inside the engine; the others went on

    @property
    def finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH_CAPPED: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_ERROR: "error",
        }.get(self)


@dataclass
class RequestTimes:
    """Engine-side timestamps (time.perf_counter seconds)."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    # KV received from a prefill instance (P2pConnector): when the read was queued, when it
    # was done, its bytes and seconds on the wire (the rest of the wait is queueing)
    kv_load_start: float | None = None
    kv_load_done: float | None = None
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0
    # KV compression: blocks the eviction policy released over the request's life
    # (re-evictions after a preemption included), and its kept KV tokens when it finished
    kv_evicted_blocks: int = 0
    kv_kept_tokens: int = 0


class Request:
    """A sequence being served. Children of an `n > 1` request are Requests too."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "output_token_ids",
        "all_token_ids",
        "sampling_params",
        "eos_token_id",
        "num_computed_tokens",
        "num_cached_tokens",
        "spec_token_ids",
        "status",
        "priority",
        "cache_salt",
        "times",
        "num_preemptions",
        "parent_id",
        "index",
        "stop_reason",
        "max_tokens",
        "error",
        "prompt_logprobs",
        "kv_transfer_params",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        max_tokens: int | None = None,
        parent_id: str | None = None,
        index: int = 0,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit tokens at first schedule; -1 = unknown
        self.spec_token_ids: list[int] = []
        self.status = RequestStatus.WAITING
        self.priority = priority
        self.cache_salt = cache_salt
        self.times = RequestTimes(
            arrival=time.perf_counter() if arrival_time is None else arrival_time
        )
        self.num_preemptions = 0
        self.parent_id = parent_id
        self.index = index
        self.stop_reason: int | None = None
        # max output tokens, resolved by the engine (SamplingParams.max_tokens or what fits).
        limit = max_tokens if max_tokens is not None else sampling_params.max_tokens
        self.max_tokens: int = limit if limit is not None else sys.maxsize
        # Why the engine finished this request with FINISHED_ERROR (None otherwise).
        self.error: str | None = None
        self.prompt_logprobs: list[LogprobsTensors] = []
        # what the KV connector returned when the request finished (a prefill instance's
        # handshake for the decode instance), sent back to the client
        self.kv_transfer_params: dict[str, Any] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs (None: not requested; what the runner reads)."""
        return self.sampling_params.prompt_logprobs

    @property
    def num_prompt_logprobs_received(self) -> int:
        """Prompt positions whose logprobs arrived (complete at num_prompt_tokens - 1)."""
        return sum(len(r) for r in self.prompt_logprobs)

    def add_prompt_logprobs(self, run: LogprobsTensors) -> None:
        """Append the part of `run` past the positions already received (a recompute after
        preemption starts again at position 0)."""
        have = self.num_prompt_logprobs_received
        if run.start > have:
            raise ValueError(
                f"request {self.request_id!r}: prompt logprobs from position {run.start} "
                f"arrived before positions {have}..{run.start - 1}"
            )
        if run.start + len(run) > have:
            self.prompt_logprobs.append(run.slice(have - run.start, len(run)))

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        return self.status.finished

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"num_tokens={self.num_tokens}, num_computed_tokens={self.num_computed_tokens})"
        )
