"""SchedulerConfig: vLLM V1 scheduling, one token budget per step.

`max_num_batched_tokens` is resolved on construction (None -> 8192 with chunked prefill, else
max(max_model_len, 8192)), so after validation it is an `int` for every reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.utils import knob

# The policies `workbench.core.sched.request_queue.REQUEST_QUEUES` implements (a test keeps the two
# equal): the names SchedulerConfig accepts.
SCHEDULING_POLICIES = ("fcfs", "priority")
# recompute: vLLM V1's (free the blocks, recompute later); swap: write them to the host KV tier
PREEMPTION_MODES = ("recompute", "swap")


@dataclass
class SchedulerConfig:
    """vLLM V1 scheduling: one token budget per step."""

    max_num_seqs: int = knob(256, "most requests running at once")
    max_num_batched_tokens: int = knob(None, "the per-step token budget (default: 8192 with "
                                             "chunked prefill, else max_model_len)",
                                       accepts=int | None)
    enable_chunked_prefill: bool = knob(True, "split a prefill that does not fit the budget "
                                              "over several steps")
    long_prefill_token_threshold: int = knob(0, "cap one prefill chunk at this many tokens "
                                                "(0 = off)")
    policy: str = knob("fcfs", "fcfs | priority (lower priority value first); vLLM's "
                               "scheduling_policy")
    preemption_mode: str = knob("recompute", "recompute (vLLM V1: free the blocks, recompute "
                                             "later) | swap (write them to the host KV tier, "
                                             "read back; needs an OffloadingConnector)")
    max_model_len: int = 2048  # filled from ModelConfig by EngineConfig

    def __post_init__(self) -> None:
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode ({self.preemption_mode!r}) must be one of "
                             f"{', '.join(PREEMPTION_MODES)}")
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs ({self.max_num_seqs}) must be an integer >= 1")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy ({self.policy!r}) must be one of "
                             f"{', '.join(SCHEDULING_POLICIES)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) must be >= 0"
            )
        self.max_num_batched_tokens = self._resolve_budget(self.max_num_batched_tokens)

    def _resolve_budget(self, given: int | None) -> int:
        """None -> the default budget; a budget must hold one token of every running request
        and, with chunked prefill off, a whole max_model_len prompt."""
        budget = given
        if budget is None:
            budget = (max(8192, self.max_num_seqs) if self.enable_chunked_prefill
                      else max(self.max_model_len, 8192))
        if budget < 1:
            raise ValueError(f"max_num_batched_tokens ({budget}) must be >= 1")
        if budget < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}); raise it or lower max_num_seqs"
            )
        if not self.enable_chunked_prefill and budget < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill off, so a long "
                "prompt could never be scheduled; raise it, lower max_model_len, or set "
                "enable_chunked_prefill=True"
            )
        return budget
