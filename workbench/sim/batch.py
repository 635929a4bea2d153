"""What one engine step computes, and the protocol every cost model implements.

The simulator builds one `BatchComposition` per scheduler step from the step's
`SchedulerOutput` (the real scheduler's decision) and asks a `CostModel` how long the forward
pass, sampling and the step's fixed overhead take. Vidur's split: the cost follows from the
batch's shape, not from the requests' identities.

Definitions (per step, over the scheduled requests; a request is "prefill" while its
computed tokens are below its prompt length, else "decode"):
- `prefill_tokens`: new prompt tokens computed this step (chunked prefill: the chunk sizes).
- `prefill_attn_pairs`: query-key pairs the prefill chunks attend, causal:
  sum over chunks of `n * computed + n * (n + 1) / 2` (n: the chunk, computed: tokens before
  it, prefix-cache hits included).
- `decode_tokens`: tokens decoded this step (1 per decoding request, `1 + k` when verifying
  k draft tokens).
- `decode_context_tokens`: KV tokens the decode queries read (each decoding request's
  context length, computed tokens before this step plus its new tokens).
- `num_seqs`: requests in the step; `sampled_rows`: rows the sampler draws from (one per
  request whose prefill completes or that decodes, plus one per draft token verified);
  `draft_tokens`: draft tokens verified this step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class BatchComposition:
    """One engine step's work (see the module docstring for each field)."""

    prefill_tokens: int = 0
    prefill_attn_pairs: int = 0
    decode_tokens: int = 0
    decode_context_tokens: int = 0
    num_seqs: int = 0
    sampled_rows: int = 0
    draft_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill_tokens", "prefill_attn_pairs", "decode_tokens",
                     "decode_context_tokens", "num_seqs", "sampled_rows", "draft_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"BatchComposition {name} ({v!r}) must be an integer >= 0")

    @property
    def num_tokens(self) -> int:
        """Tokens through the model's GEMMs this step."""
        return self.prefill_tokens + self.decode_tokens


class CostModel(Protocol):
    """Predicts one engine step's wall time."""

    def step_time_s(self, batch: BatchComposition) -> float:
        """Seconds for one step of `batch` (forward, sampling and the step's overhead)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What predicted the times: {"source": "calibrated" | "analytic" | ..., "profile":
        name, "hardware": ..., "model": ..., ...}; logged with every simulated run."""
        ...
