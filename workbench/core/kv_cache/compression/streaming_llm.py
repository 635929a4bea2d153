"""StreamingLLM (Xiao et al. 2023): attention sinks + a recent window, decided from lengths.

    sink blocks   ceil(sink_tokens / bs): the first blocks, never evicted
    window        ceil(recent_tokens / bs) blocks, recent_tokens defaulting to
                  budget - sinks; so sink + window blocks = ceil(budget / bs) by default
    rule          when the blocks held after this step's tokens are written would exceed
                  sink + window blocks, evict the oldest non-sink evictable blocks (full,
                  written, not the block being written) until they do not, or none is left

    bs 4, sink_tokens 4, budget 16 (window 3 blocks), decoding at logical position 21:
    logical blocks   0 | 1 2 | 3 4 5
    kept             S | x x | W W W      (blocks 1, 2 evicted; block 5 holds 20..23)

A prefill chunk larger than the window keeps all its own blocks until the next step: only
written blocks are evictable, so the held blocks may exceed the budget by the chunk, never
by more. The window keeps at least one block (the one being written).
"""

from __future__ import annotations

from workbench.core.kv_cache.compression.policy import (
    EvictionDecision,
    KVCompressionPolicy,
    RequestKVView,
    register_policy,
)


@register_policy
class StreamingLLMPolicy(KVCompressionPolicy):
    method = "streaming_llm"

    def limits(self, view: RequestKVView) -> tuple[int, int]:
        """(sink blocks, window blocks) for this request."""
        bs = self.block_size
        cfg = self.config
        sink = -(-cfg.sink_tokens // bs)
        if cfg.recent_tokens is not None:
            window = -(-cfg.recent_tokens // bs)
            window = min(window, max(1, view.budget_blocks - sink))
        else:
            window = view.budget_blocks - sink
        return sink, max(1, window)

    def select(self, view: RequestKVView) -> EvictionDecision | None:
        sink, window = self.limits(view)
        excess = view.num_blocks_after_step - (sink + window)
        if excess <= 0:
            return None
        candidates = [b for b in view.evictable if b >= sink]
        evict = candidates[:excess]
        return EvictionDecision(evict=evict) if evict else None
