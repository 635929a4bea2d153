"""SnapKV (Li et al. 2024): once the prompt is written, keep the prompt blocks its last
`window_size` tokens attend to most, plus the window itself; decode then grows the cache as
usual (nothing more is evicted).

    scores      on the step whose tokens reach the end of the prompt, the worker scores the
                observation window: the prompt's last window_size positions (those of them
                scheduled that step) as queries, the prompt before the window as keys; per
                head the probabilities are summed over the window, pooled over
                `kernel_size` neighbouring tokens (`pooling` max or avg), summed over heads,
                then over each block's tokens (workbench.attention.scores); one row per layer
    selection   on the next step: window blocks W (those holding any of the last
                window_size prompt tokens) are kept; of the other prompt blocks the
                budget_blocks - |W| with the highest score summed over layers are kept (one
                shared selection for every layer); the rest are evicted. With the prompt's
                blocks at or under budget_blocks nothing is scored or evicted.

    bs 4, prompt 22 tokens (blocks 0..5), window 6 (tokens 16..21: blocks 4, 5), budget 16
    (4 blocks): keep 4, 5 and the two best of 0..3; scores 0: 2.5, 1: 0.25, 2: 1.5, 3: 2.5
    -> keep 0, 3, 4, 5; evict 1, 2.

A budget smaller than the window keeps the window alone. PyramidKV (pyramidkv.py) is this
selection with a budget per layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.core.kv_cache.compression.policy import (
    EvictionDecision,
    KVCompressionPolicy,
    RequestKVView,
    register_policy,
)
from workbench.core.kv_cache.compression.selection import (
    layer_block_scores,
    top_blocks,
    window_blocks,
)

if TYPE_CHECKING:
    import numpy as np

    from workbench.config.kv_compression import KVCompressionConfig


@register_policy
class SnapKVPolicy(KVCompressionPolicy):
    method = "snapkv"
    needs_scores = True
    score_when = "prefill_end"

    def __init__(self, config: KVCompressionConfig, block_size: int, num_layers: int) -> None:
        super().__init__(config, block_size, num_layers)
        self._scores: dict[str, list[dict[int, float]]] = {}  # per layer {block: score}
        self._done: set[str] = set()  # requests whose prompt was compressed

    def window(self, view: RequestKVView) -> tuple[int, int]:
        """The observation window: logical token positions [first, end) of the prompt."""
        p = view.num_prompt_tokens
        return max(0, p - self.config.window_size), p

    def wants_compression(self, view: RequestKVView) -> bool:
        prompt_blocks = -(-view.num_prompt_tokens // self.block_size)
        return view.request_id not in self._done and prompt_blocks > view.budget_blocks

    def score_queries(self, view: RequestKVView) -> tuple[int, int] | None:
        start = view.num_computed_tokens
        end = start + view.num_new_tokens
        p = view.num_prompt_tokens
        if not (start < p <= end) or not self.wants_compression(view):
            return None
        first, _ = self.window(view)
        return max(start, first), p

    def observe(self, request_id: str, view: RequestKVView, scores: np.ndarray) -> None:
        if request_id not in self._done:
            self._scores[request_id] = layer_block_scores(view, scores)

    def select(self, view: RequestKVView) -> EvictionDecision | None:
        rid = view.request_id
        per_layer = self._scores.get(rid)
        if per_layer is None or not view.prompt_done:
            return None
        del self._scores[rid]
        self._done.add(rid)
        return self.decide(view, per_layer)

    def candidates(self, view: RequestKVView) -> tuple[list[int], list[int]]:
        """(window blocks, evictable prompt blocks outside the window)."""
        first, end = self.window(view)
        win = window_blocks(first, end, self.block_size)
        prompt_blocks = -(-view.num_prompt_tokens // self.block_size)
        skip = set(win)
        cands = [b for b in view.evictable if b < prompt_blocks and b not in skip]
        return win, cands

    def decide(self, view: RequestKVView, per_layer: list[dict[int, float]]
               ) -> EvictionDecision | None:
        win, cands = self.candidates(view)
        summed: dict[int, float] = {}
        for scores in per_layer:
            for block, value in scores.items():
                summed[block] = summed.get(block, 0.0) + value
        keep = set(top_blocks(cands, summed, view.budget_blocks - len(win)))
        evict = [b for b in cands if b not in keep]
        return EvictionDecision(evict=evict) if evict else None

    def forget(self, request_id: str) -> None:
        self._scores.pop(request_id, None)
        self._done.discard(request_id)
