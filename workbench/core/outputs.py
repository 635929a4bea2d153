"""ModelRunnerOutput: what one step's forward hands back to the engine (vLLM's name).

Part of the torch-free core (vLLM's `v1/outputs.py`): the worker fills it, the engine and the
scheduler read it; tensors are only typed here (torch is imported where they are joined).

Request ids key every field; a request missing from `sampled_token_ids` got no token this
step (a prefill chunk that does not reach the end of the prompt, or a request that failed).

Prompt logprobs (`SamplingParams.prompt_logprobs`) travel as `LogprobsTensors`, one run of
consecutive prompt positions per request and step (a prefill chunk's positions):

    prompt        t0  t1  t2  t3  t4          chunk 1 computes t0 t1 t2, chunk 2 t3 t4
    row of        t0  t1  t2 | t3             (t4's row predicts the first output token)
    scores        t1  t2  t3 | t4             start = 0, then start = 3
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.distributed.kv_transfer.metadata import KVConnectorOutput

if TYPE_CHECKING:
    import torch


@dataclass
class LogprobsTensors:
    """Log-probabilities of prompt tokens at positions start+1 .. start+len (vLLM's name).

    Row i is the distribution computed at position start + i, scoring the prompt token at
    start + i + 1 (float32 log_softmax of the logits, on the CPU).

    logprob_token_ids: [n, 1 + k] int64; column 0 the actual prompt token, then the top-k
        (descending logprob). With k = -1 only column 0: the whole vocabulary is in
        `full_logprobs`.
    logprobs: [n, 1 + k] float32, the same layout.
    selected_token_ranks: [n] int64, the actual token's rank: 1 + the number of tokens with a
        strictly greater logprob (1 = the argmax; vLLM's definition).
    full_logprobs: [n, vocab] float32 indexed by token id (k = -1 only, else None).
    """

    start: int
    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor
    full_logprobs: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.selected_token_ranks.shape[0])

    @property
    def token_logprobs(self) -> torch.Tensor:
        """[n] the actual tokens' logprobs."""
        return self.logprobs[:, 0]

    def slice(self, begin: int, end: int) -> LogprobsTensors:
        """Rows begin..end-1 (positions start+begin ..), as a new run."""
        full = self.full_logprobs
        return LogprobsTensors(
            self.start + begin, self.logprob_token_ids[begin:end], self.logprobs[begin:end],
            self.selected_token_ranks[begin:end], None if full is None else full[begin:end],
        )

    @staticmethod
    def concat(runs: list[LogprobsTensors]) -> LogprobsTensors:
        """Consecutive runs (each starting where the previous ends) as one."""
        import torch  # only where tensors are joined: the core imports no torch

        for a, b in zip(runs, runs[1:], strict=False):
            if b.start != a.start + len(a):
                raise ValueError(f"runs are not consecutive: {a.start}+{len(a)} != {b.start}")
        if len(runs) == 1:
            return runs[0]
        full = [r.full_logprobs for r in runs]
        return LogprobsTensors(
            runs[0].start,
            torch.cat([r.logprob_token_ids for r in runs]),
            torch.cat([r.logprobs for r in runs]),
            torch.cat([r.selected_token_ranks for r in runs]),
            torch.cat(present) if len(present := [f for f in full if f is not None]) == len(full)
            else None,
        )


@dataclass
class WorkerPhaseTimes:
    """Seconds one `execute_model` spent per phase, `time.perf_counter()` at the boundaries
    the runner already has (rank 0's, with tensor parallelism: its forward includes waiting
    for the other ranks' collectives).

    prepare_inputs_s: copy-on-write block copies + the flat batch (`prepare_inputs`).
    forward_s: the model forward only (a CUDA-graph replay or eager).
    sample_s: logits + sampling metadata + sampling or verification (+ prompt logprobs).
    spec_propose_s: the speculative proposer (n-gram or the draft model's forwards); 0
        without speculation.

    On CUDA the kernels run asynchronously: these are host (launch) times and the wait for
    the device lands in whichever phase synchronizes first (the sampler's `.tolist()`), unless
    WORKBENCH_SYNC_STEP_TIMING=1 makes the runner synchronize at every boundary
    (`workbench.worker.phase_clock`; true device times, at the cost of the overlap). On CPU
    they are true times as they are.
    """

    prepare_inputs_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0
    spec_propose_s: float = 0.0

    def add(self, other: WorkerPhaseTimes) -> None:
        """Add `other`'s seconds (the engine's one-by-one re-run after a failed batch)."""
        self.prepare_inputs_s += other.prepare_inputs_s
        self.forward_s += other.forward_s
        self.sample_s += other.sample_s
        self.spec_propose_s += other.spec_propose_s


@dataclass
class ModelRunnerOutput:
    """sampled_token_ids: request id -> the tokens accepted this step (one when sampling; with
    speculative decoding the accepted drafts plus the bonus or recovered token).
    prompt_logprobs: request id -> this step's run of prompt logprobs, for requests with
    `SamplingParams.prompt_logprobs` whose scheduled tokens include prompt positions that
    score a prompt token; empty otherwise (no cost for other requests).
    spec_token_ids: request id -> the drafts the worker's proposer made for the next step
    (from this step's tokens); the scheduler keeps them only for requests still running. The
    distributions they were drawn from stay on the worker, for their verification.
    spec_decode_error: why this step has no drafts (the proposer raised); None otherwise.
    kv_connector_output: the KV connector's report (loads finished or failed, counters).
    phase_times: the worker's seconds per phase of this step (`WorkerPhaseTimes`); the
    engine puts them in the step trace (`StepRecord`).
    kv_block_scores: KV compression's score-based policies: request id -> float32 numpy
    array [num_layers, kept blocks] (or [num_layers, kept tokens] for a token-granular
    policy), the attention the queries named in `SchedulerOutput.kv_score_queries` gave each
    block of the table the forward ran with, summed over heads and queries
    (`workbench.core.kv_cache.compression.policy` defines it); empty otherwise."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    prompt_logprobs: dict[str, LogprobsTensors] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    spec_decode_error: str | None = None
    kv_connector_output: KVConnectorOutput | None = None  # loads done, transfer counters
    phase_times: WorkerPhaseTimes = field(default_factory=WorkerPhaseTimes)
    kv_block_scores: dict[str, Any] = field(default_factory=dict)  # np.ndarray values

    def merge(self, other: ModelRunnerOutput) -> None:
        """Add `other`'s requests (the engine's one-by-one re-run after a failed batch)."""
        self.sampled_token_ids.update(other.sampled_token_ids)
        self.prompt_logprobs.update(other.prompt_logprobs)
        self.spec_token_ids.update(other.spec_token_ids)
        self.spec_decode_error = self.spec_decode_error or other.spec_decode_error
        self.kv_connector_output = self.kv_connector_output or other.kv_connector_output
        self.phase_times.add(other.phase_times)
        self.kv_block_scores.update(other.kv_block_scores)
