"""H2O (Zhang et al. 2023, "Heavy-Hitter Oracle"): keep the recent window plus the blocks
that have received the most attention so far, evicting during decode.

    scores        every step, the worker reports the attention each block received from
                  every query token scheduled that step (prefill chunks and decode tokens),
                  summed over heads and layers; the policy adds it to the block's total, so
                  a block's score is the attention of every query since it was written
                  (H2O's accumulated attention; one shared selection for all layers)
    recent        R = ceil(recent_tokens / bs) blocks, recent_tokens defaulting to half the
                  budget (H2O's even split between heavy hitters and recent tokens); at least
                  the block being written
    heavy hitters the other budget_blocks - R blocks: the highest totals
    rule          once the prompt is written, when the blocks held after this step would
                  exceed budget_blocks, evict the lowest-total evictable blocks outside the
                  recent window (ties: the newer goes first) until they do not

    bs 4, budget 16 (4 blocks: 2 recent + 2 heavy), decoding at logical position 21:
    logical blocks  0    1    2    3    4 | 5       totals 0: 9.0, 1: 0.5, 2: 3.0, 3: 1.0
    kept            H    x    H    x    R   R       (blocks 1 and 3 evicted)

A prompt longer than the budget is held whole until its first decode step, then cut to the
budget in one step (H2O scores the prompt with the prompt's own attention first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.core.kv_cache.compression.policy import (
    EvictionDecision,
    KVCompressionPolicy,
    RequestKVView,
    register_policy,
)
from workbench.core.kv_cache.compression.selection import bottom_blocks, summed_block_scores

if TYPE_CHECKING:
    import numpy as np

    from workbench.config.kv_compression import KVCompressionConfig


@register_policy
class H2OPolicy(KVCompressionPolicy):
    method = "h2o"
    needs_scores = True
    score_when = "decode"  # prefill chunks too: score_queries names every step's tokens

    def __init__(self, config: KVCompressionConfig, block_size: int, num_layers: int) -> None:
        super().__init__(config, block_size, num_layers)
        self._totals: dict[str, dict[int, float]] = {}

    def recent_blocks(self, view: RequestKVView) -> int:
        """R: blocks of the recent window (at least 1, at most the budget)."""
        recent = self.config.recent_tokens
        if recent is None:
            recent = view.budget_tokens // 2
        r = -(-recent // self.block_size)
        return max(1, min(r, view.budget_blocks))

    def totals(self, request_id: str) -> dict[int, float]:
        """{logical block: accumulated score} of a request (a copy)."""
        return dict(self._totals.get(request_id, {}))

    def score_queries(self, view: RequestKVView) -> tuple[int, int] | None:
        if view.num_new_tokens <= 0:
            return None
        return view.num_computed_tokens, view.num_computed_tokens + view.num_new_tokens

    def observe(self, request_id: str, view: RequestKVView, scores: np.ndarray) -> None:
        totals = self._totals.setdefault(request_id, {})
        for block, value in summed_block_scores(view, scores).items():
            totals[block] = totals.get(block, 0.0) + value

    def select(self, view: RequestKVView) -> EvictionDecision | None:
        if not view.prompt_done:
            return None
        budget = view.budget_blocks
        excess = view.num_blocks_after_step - budget
        if excess <= 0:
            return None
        end = view.num_computed_tokens + view.num_new_tokens  # logical tokens after the step
        last = (end - 1) // self.block_size
        first_recent = last - self.recent_blocks(view) + 1
        candidates = [b for b in view.evictable if b < first_recent]
        totals = self._totals.get(view.request_id, {})
        evict = bottom_blocks(candidates, totals, excess)
        if not evict:
            return None
        for b in evict:
            totals.pop(b, None)
        return EvictionDecision(evict=evict)

    def forget(self, request_id: str) -> None:
        self._totals.pop(request_id, None)
