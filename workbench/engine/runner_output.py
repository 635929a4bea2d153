"""ModelRunnerOutput: what one step's forward hands back to the engine (vLLM's name).

A shared leaf like `SchedulerOutput`: the worker fills it, the engine and the scheduler read
it. Request ids key every field; a request missing from `sampled_token_ids` got no token this
step (a prefill chunk that does not reach the end of the prompt, or a request that failed).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelRunnerOutput:
    """sampled_token_ids: request id -> the tokens accepted this step (one when sampling; with
    speculative decoding the accepted drafts plus the bonus or recovered token)."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)

    def merge(self, other: ModelRunnerOutput) -> None:
        """Add `other`'s requests (the engine's one-by-one re-run after a failed batch)."""
        self.sampled_token_ids.update(other.sampled_token_ids)

