"""The worker's own per-request state (vLLM V1's `CachedRequestState` in the model runner).

Built from the step message and kept from step to step; the scheduler's `Request` never
reaches a worker:

    NewRequestData       -> a CachedRequestState (prompt, sampling params, block table)
    CachedRequestData    -> num_computed_tokens; new block ids appended (the whole table when
                            resumed_from_preemption: `epoch` + 1, so the persistent batch
                            rebuilds the request's row); new_token_ids on ranks that do not
                            sample
    num_evicted_tokens   -> with a resumed entry (its whole table): the KV compression
                            offset (row slot = logical position - it; 0 when absent)
    finished_req_ids     -> dropped
    after sampling       -> the driver worker appends the accepted tokens itself
                            (`append_sampled`), as the scheduler does to its Request

A preempted request keeps its state (its tokens are still right) until it is finished.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from workbench.core.sched.output import NewRequestData, SchedulerOutput
    from workbench.sampling_params import SamplingParams


class CachedRequestState:
    """all_token_ids: prompt + the tokens sampled so far (this worker's or, on a TP rank that
    does not sample, rank 0's from new_token_ids). spec_token_probs: the distributions this
    request's latest drafts were drawn from ([k, vocab]; None: one-hot drafts), read when they
    are verified."""

    __slots__ = ("req_id", "prompt_token_ids", "sampling_params", "eos_token_id",
                 "max_tokens", "block_ids", "num_computed_tokens", "all_token_ids",
                 "num_prompt_tokens", "epoch", "spec_token_probs", "num_evicted_tokens")

    def __init__(
        self, req_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
        block_ids: list[int], num_computed_tokens: int, eos_token_id: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.req_id = req_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        limit = max_tokens if max_tokens is not None else sampling_params.max_tokens
        self.max_tokens: int = limit if limit is not None else sys.maxsize
        self.block_ids = block_ids
        self.num_computed_tokens = num_computed_tokens
        self.all_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.epoch = 0  # + 1 whenever the block table is replaced (resumed from preemption)
        self.spec_token_probs: torch.Tensor | None = None
        # KV compression: tokens of the blocks evicted from block_ids (set with the table)
        self.num_evicted_tokens = 0

    @classmethod
    def from_new(cls, data: NewRequestData) -> CachedRequestState:
        return cls(data.req_id, data.prompt_token_ids, data.sampling_params,
                   list(data.block_ids), data.num_computed_tokens, data.eos_token_id,
                   data.max_tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs (None: not requested)."""
        return self.sampling_params.prompt_logprobs

    def __repr__(self) -> str:
        return (f"CachedRequestState({self.req_id!r}, num_tokens={self.num_tokens}, "
                f"num_computed_tokens={self.num_computed_tokens})")


def update_request_states(
    states: dict[str, CachedRequestState], out: SchedulerOutput, apply_new_token_ids: bool,
) -> tuple[list[CachedRequestState], list[CachedRequestState]]:
    """Bring `states` to the message (vLLM's `_update_states`, its request half): drop the
    finished, add the new, apply the cached requests' deltas. Returns (the scheduled states in
    batch order, the states whose view starts afresh: new or resumed, for the proposer).
    `apply_new_token_ids`: this rank does not sample (TP ranks 1..N-1), so the tokens it
    lacks come in the message."""
    for rid in out.finished_req_ids:
        states.pop(rid, None)
    started: list[CachedRequestState] = []
    for data in out.scheduled_new_reqs:
        st = states[data.req_id] = CachedRequestState.from_new(data)
        started.append(st)
    cached = out.scheduled_cached_reqs
    token_ids = cached.new_token_ids if apply_new_token_ids else []
    for i, rid in enumerate(cached.req_ids):
        st = states[rid]
        st.num_computed_tokens = cached.num_computed_tokens[i]
        new_blocks = cached.new_block_ids[i]
        if cached.resumed_from_preemption[i]:
            st.block_ids = list(new_blocks or [])
            st.num_evicted_tokens = out.num_evicted_tokens.get(rid, 0)
            st.epoch += 1
            started.append(st)
        elif new_blocks:
            st.block_ids.extend(new_blocks)
        if token_ids:
            st.all_token_ids.extend(token_ids[i])
    return [states[rid] for rid in out.num_scheduled_tokens], started


def append_sampled(states: dict[str, CachedRequestState],
                   sampled: Iterable[tuple[str, list[int]]]) -> None:
    """The driver worker's own copy of this step's accepted tokens (the scheduler appends
    the same to its Requests; it may stop a request early, which then finishes)."""
    for rid, tokens in sampled:
        st = states.get(rid)
        if st is not None:
            st.all_token_ids.extend(tokens)
