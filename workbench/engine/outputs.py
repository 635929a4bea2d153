"""RequestOutput / CompletionOutput (vLLM's shapes) with per-request engine timings.

Prompt logprobs (`SamplingParams(prompt_logprobs=k)`) come two ways:

    out.prompt_logprobs          vLLM's list: None for the first prompt token, then one dict
                                 per position {token id: Logprob(logprob, rank, None)} holding
                                 the top-k and the actual token (built on first access)
    out.prompt_logprobs_tensors  the compact form for bulk scoring (`LogprobsTensors`, start
                                 0): row i scores prompt token i + 1; `.token_logprobs` [P-1],
                                 `.selected_token_ranks`, and with k = -1 `.full_logprobs`
                                 [P-1, vocab], with no per-token Python objects
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from workbench.core.outputs import LogprobsTensors
from workbench.core.request import Request


@dataclass
class Logprob:
    """One token's log-probability at one position (vLLM's). rank: 1 = the most likely;
    the actual token's rank is 1 + the number of tokens with a strictly greater logprob, a
    top-k entry's is its place in the top-k. decoded_token: None here (detokenizing every
    entry is costly); decode ids with `LLM.get_tokenizer()`."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, Logprob] | None]


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
    # KV compression (kv_compression_config): blocks evicted, KV tokens kept at the end
    num_evicted_blocks: int = 0
    num_kept_kv_tokens: int = 0

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
            num_evicted_blocks=t.kv_evicted_blocks,
            num_kept_kv_tokens=t.kv_kept_tokens,
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
    # SamplingParams.prompt_logprobs set: every position after the first (None otherwise, or
    # when the request failed)
    prompt_logprobs_tensors: LogprobsTensors | None = field(default=None, repr=False)
    # the KV connector's answer at the end (a prefill leg's handshake; vLLM's field)
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def num_cached_tokens(self) -> int:
        return self.metrics.num_cached_tokens if self.metrics else 0

    @cached_property
    def prompt_logprobs(self) -> PromptLogprobs | None:
        """vLLM's prompt logprobs (see the module docstring); None when not requested."""
        t = self.prompt_logprobs_tensors
        return None if t is None else build_prompt_logprobs(t)


def build_prompt_logprobs(t: LogprobsTensors) -> PromptLogprobs:
    """[None, {id: Logprob}, ...] from a run starting at position 0: per position the actual
    token first (its computed rank), then the top-k (ranks 1..k), or with `full_logprobs`
    every token of the vocabulary (each with its computed rank)."""
    out: PromptLogprobs = [None]
    ids, vals = t.logprob_token_ids.tolist(), t.logprobs.tolist()
    ranks = t.selected_token_ranks.tolist()
    full = t.full_logprobs
    if full is not None:
        # rank = 1 + count of strictly greater values, for every token at once
        ascending = full.sort(dim=-1).values
        full_ranks = 1 + full.shape[-1] - torch.searchsorted(ascending, full, right=True)
    for i, (row_ids, row_vals) in enumerate(zip(ids, vals, strict=True)):
        entry = {row_ids[0]: Logprob(row_vals[0], ranks[i])}
        if full is not None:
            for tok, (lp, rank) in enumerate(zip(full[i].tolist(), full_ranks[i].tolist(),
                                                 strict=True)):
                entry.setdefault(tok, Logprob(lp, rank))
        else:
            for place, (tok, lp) in enumerate(zip(row_ids[1:], row_vals[1:], strict=True)):
                entry.setdefault(tok, Logprob(lp, place + 1))
        out.append(entry)
    return out


def collect_prompt_logprobs(req: Request) -> LogprobsTensors | None:
    """The request's runs as one (start 0, num_prompt_tokens - 1 rows); None when it did not
    ask for prompt logprobs, failed, or has not received them all."""
    k = req.num_prompt_logprobs
    if k is None or req.error is not None:
        return None
    if req.num_prompt_logprobs_received != req.num_prompt_tokens - 1:
        return None
    if req.prompt_logprobs:
        return LogprobsTensors.concat(req.prompt_logprobs)
    width = 1 if k == -1 else 1 + k  # a one-token prompt: no position to score
    return LogprobsTensors(
        0, torch.empty(0, width, dtype=torch.int64), torch.empty(0, width),
        torch.empty(0, dtype=torch.int64), torch.empty(0, 0) if k == -1 else None,
    )
