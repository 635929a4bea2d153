"""N-gram (prompt lookup) proposer, vLLM's semantics.

For each n from prompt_lookup_max down to prompt_lookup_min, look for an earlier occurrence
of the context's last n tokens (context = prompt + output so far). The longest n that matches
wins; among its matches the earliest one is used, and the up-to-k tokens that followed it are
the draft (fewer when the context ends sooner). k is capped so the request cannot pass
max_model_len, and (here, to avoid verifying tokens that can never be emitted) so that
accepted drafts plus the bonus token stay within the request's max_tokens.

    context  [a b c d x y b c d]      n = 3: suffix [b c d] found at 1 -> draft [x y b c d][:k]

n-gram drafts are one-hot: q = 1 at the draft token, so the rejection sampler accepts with
probability p(draft).

The model runner owns the proposer and calls it inside `execute_model`, right after sampling,
before the worker appends the sampled tokens: the context is `all_token_ids + sampled`
(`workbench.spec_decode.proposer`). It keeps no per-request state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from workbench.config import SpeculativeConfig
from workbench.spec_decode.proposer import DraftProposal, Proposer, max_draft_tokens

if TYPE_CHECKING:
    from workbench.core.sched.output import SchedulerOutput
    from workbench.worker.request_state import CachedRequestState


def propose_ngram(
    tokens: np.ndarray, min_n: int, max_n: int, k: int
) -> list[int]:
    """Draft for one context (1-D int array); [] when no n-gram in [min_n, max_n] recurs."""
    total = tokens.shape[0]
    if k <= 0 or total < min_n + 1:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n:]
        windows = sliding_window_view(tokens[: total - 1], n)  # starts 0 .. total-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_model_len = max_model_len

    def propose(
        self, requests: Sequence[CachedRequestState], scheduler_output: SchedulerOutput,
        sampled: dict[str, list[int]], failed: dict[str, str] | None = None,
    ) -> DraftProposal:
        """Drafts (request id -> token ids; one-hot, so no distributions) for the requests
        that got tokens this step, from their context `all_token_ids + sampled[id]`; a
        request without drafts is absent."""
        drafts: dict[str, list[int]] = {}
        for req in requests:
            new = sampled.get(req.req_id)
            if not new:
                continue
            k = max_draft_tokens(req, self.num_speculative_tokens, self.max_model_len,
                                 len(new))
            if not k:
                continue
            tokens = np.asarray(req.all_token_ids + new, dtype=np.int64)
            draft = propose_ngram(tokens, self.min_n, self.max_n, k)
            if draft:
                drafts[req.req_id] = draft
        return DraftProposal(drafts, {})
