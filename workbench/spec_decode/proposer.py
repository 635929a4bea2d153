"""Proposer: the one interface every speculative proposer implements (n-gram, draft model;
EAGLE or suffix decoding would be one more class).

    ModelRunner.execute_model:  forward -> sample -> Proposer.propose(...) -> DraftProposal
                                -> ModelRunnerOutput.spec_token_ids (to the scheduler);
                                   the distributions stay on the worker, for verification
    lifecycle:                  start_requests (new, or resumed from preemption),
                                remove_requests (finished)

A proposer keeps whatever per-request state it needs (a draft model's KV progress) inside
itself, keyed by request id; it reads the worker's `CachedRequestState`s and never a live
`Request`. `propose` sees this step's accepted tokens before the worker appends them: a
request's context is `all_token_ids + sampled[req_id]`. It must change its own state only
when it returns (a raise costs this step's drafts, nothing else).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

    from workbench.core.sched.output import SchedulerOutput
    from workbench.worker.request_state import CachedRequestState


class DraftProposal(NamedTuple):
    """token_ids: request id -> drafts for its next step (absent: none).
    probs: request id -> [k, vocab] distributions the drafts were drawn from; absent:
    one-hot drafts (n-gram, a greedy draft model)."""

    token_ids: dict[str, list[int]]
    probs: dict[str, torch.Tensor]


class Proposer(ABC):
    num_speculative_tokens: int

    @abstractmethod
    def propose(
        self, requests: Sequence[CachedRequestState], scheduler_output: SchedulerOutput,
        sampled: dict[str, list[int]], failed: dict[str, str] | None = None,
    ) -> DraftProposal:
        """Drafts for the requests in `sampled` (those that got tokens this step); `requests`
        are this step's scheduled requests in batch order, `failed` the ones whose step
        failed (skip them)."""

    def start_requests(self, requests: Sequence[CachedRequestState]) -> None:  # noqa: B027
        """Requests whose worker view starts afresh (new, or resumed after a preemption):
        whatever the proposer knows of them starts at their num_computed_tokens."""

    def remove_requests(self, req_ids: Iterable[str]) -> None:  # noqa: B027
        """Finished requests: forget them."""


def max_draft_tokens(req: CachedRequestState, k: int, max_model_len: int,
                     num_new: int = 0) -> int:
    """k, capped so the request cannot pass max_model_len and so that accepted drafts plus
    the bonus token stay within its max_tokens (shared by the proposers). `num_new`: tokens
    sampled for it this step that are not appended yet."""
    room_len = max_model_len - req.num_tokens - num_new
    room_out = req.max_tokens - req.num_output_tokens - num_new - 1
    return max(0, min(k, room_len, room_out))
