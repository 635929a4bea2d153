"""SchedulerOutput: the one step message (vLLM V1's), from `Scheduler.schedule()` to every
worker: in-process to rank 0's model runner and, pickled as it is, to the other TP ranks.

It is a delta. A request scheduled for the first time travels whole (`NewRequestData`: its
prompt, sampling parameters, block table); afterwards only what changed travels
(`CachedRequestData`: new block ids, num_computed_tokens, resumed-from-preemption). The
workers keep their own per-request state (`workbench.worker.request_state`) and append the
tokens they sample themselves, so a step costs O(scheduled requests + new blocks), not
O(context), and no worker ever sees a live `Request`.

    step 1   new:    a(prompt 10 tokens, blocks [1, 2, 3], computed 0)
    step 2   cached: a(new blocks None, computed 10)       new: b(prompt, [1, 2, 4], computed 8)
    step 3   cached: a(new blocks [5], computed 11), b(None, 10)
    ...      a preempted, later resumed: cached a(resumed, blocks [6, 7, 8] = the whole table)

Batch order is `num_scheduled_tokens`' order (running requests first, then those admitted
this step); `req_ids` reads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata

if TYPE_CHECKING:
    from workbench.core.request import Request
    from workbench.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request the workers have not seen (vLLM's name): what a worker's per-request state
    is built from. `sampling_params` carries prompt_logprobs k (which rows score prompt
    logprobs: every TP rank computes them, the LM head's all-gather being a collective);
    `eos_token_id` and `max_tokens` are what min_tokens and the proposers read."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None
    max_tokens: int

    @classmethod
    def from_request(cls, request: Request, block_ids: list[int]) -> NewRequestData:
        return cls(
            req_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params, block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            eos_token_id=request.eos_token_id, max_tokens=request.max_tokens,
        )


@dataclass
class CachedRequestData:
    """Requests the workers already hold, one entry each per list (vLLM's name).

    resumed_from_preemption[i]: the worker's view of the request starts again from this
        entry: new_block_ids[i] is the whole block table (the request was preempted since its
        last step, or its table was rewritten: see below); otherwise new_block_ids[i] holds
        the blocks appended since its last step (None: none).
    new_token_ids[i]: the tokens it gained since the workers last got it (the tokens rank 0
        sampled, drafts excluded), for ranks that do not sample and so cannot know them (TP
        ranks 1..N-1: rank 0's runner fills them before sending,
        `workbench.executor.tp_model_runner`); empty in-process, where the runner appended them.
    num_computed_tokens[i]: tokens with KV in the cache before this step.

    A step that copies blocks (copy-on-write, `blocks_to_copy`, which replaces held blocks)
    sends every cached request so, as does the engine's one-by-one re-run of a failed step
    (`SchedulerOutput.for_request`: the failed attempt may already have applied the delta).
    """

    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_block_ids: list[list[int] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def append(self, req_id: str, resumed: bool, new_block_ids: list[int] | None,
               num_computed_tokens: int) -> None:
        self.req_ids.append(req_id)
        self.resumed_from_preemption.append(resumed)
        self.new_block_ids.append(new_block_ids)
        self.num_computed_tokens.append(num_computed_tokens)


@dataclass
class SchedulerOutput:
    """One step's plan.

    scheduled_new_reqs / scheduled_cached_reqs: the delta above.
    num_scheduled_tokens: request id -> new tokens to compute this step (incl. drafts), in
        batch order; total_num_scheduled_tokens their sum.
    scheduled_spec_decode_tokens: request id -> the drafts verified this step (the request's
        spec_token_ids, trimmed to the budget); only requests with drafts appear.
    blocks_to_copy: copy-on-write operations (src block id, dst block id) to run before the
        forward pass.
    finished_req_ids: requests finished (or aborted, or failed) since the previous
        schedule(): the workers drop their state for them before this step's batch, so a
        reused request id starts afresh.
    preempted_request_ids: requests preempted in this schedule() (they keep their worker
        state; when they run again they come back resumed_from_preemption).
    num_prefill_tokens / num_decode_tokens: the total split by whether a request had
        computed its prompt (the step trace's columns; prompt logprobs only on prefill steps).
    kv_connector_metadata: the KV connector's transfers for this step.
    num_evicted_tokens: KV compression (docs/kv_compression.md): request id -> tokens of the
        blocks it evicted, for every cached request sent with its whole table
        (resumed_from_preemption) whose table has evictions; such a request's row slot for
        logical position p is p - num_evicted_tokens (absent: 0, nothing evicted). Its
        positions stay logical.
    kv_score_queries: request id -> (first, end) logical query positions among this step's
        tokens whose attention the worker reports in `ModelRunnerOutput.kv_block_scores`
        (score-based eviction policies).
    kv_layer_drops: request id -> per layer, the row positions of this step's table that the
        layer does not attend (per-layer budgets); absent: every layer attends every block.
    """

    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_request_ids: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    kv_connector_metadata: KVConnectorMetadata | None = None
    num_evicted_tokens: dict[str, int] = field(default_factory=dict)
    kv_score_queries: dict[str, tuple[int, int]] = field(default_factory=dict)
    kv_layer_drops: dict[str, list[list[int]]] = field(default_factory=dict)

    @property
    def req_ids(self) -> list[str]:
        """The scheduled requests in batch order."""
        return list(self.num_scheduled_tokens)

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens

    def for_request(self, req_id: str, block_ids: list[int], is_prefill: bool) -> SchedulerOutput:
        """This step with only `req_id` scheduled (the engine's one-by-one re-run of a failed
        forward). A cached request is sent with its whole table (`block_ids`), resumed, so
        the message applies whether or not the failed attempt applied this step's delta; no
        copies (the caller ran them once), no finished ids (already delivered)."""
        n = self.num_scheduled_tokens[req_id]
        spec = self.scheduled_spec_decode_tokens.get(req_id)
        alone = SchedulerOutput(
            num_scheduled_tokens={req_id: n}, total_num_scheduled_tokens=n,
            scheduled_spec_decode_tokens={req_id: spec} if spec is not None else {},
            num_prefill_tokens=n if is_prefill else 0, num_decode_tokens=0 if is_prefill else n,
        )
        for name in ("num_evicted_tokens", "kv_score_queries", "kv_layer_drops"):
            value = getattr(self, name).get(req_id)
            if value is not None:
                getattr(alone, name)[req_id] = value
        new = [d for d in self.scheduled_new_reqs if d.req_id == req_id]
        if new:
            alone.scheduled_new_reqs = new
        else:
            i = self.scheduled_cached_reqs.req_ids.index(req_id)
            alone.scheduled_cached_reqs.append(
                req_id, True, list(block_ids), self.scheduled_cached_reqs.num_computed_tokens[i])
        return alone


def yield_req_data(out: SchedulerOutput) -> Iterator[tuple[str, list[int], bool]]:
    """(request id, block ids, replace) for every scheduled request (vLLM's helper for the
    scheduler-side KV connectors, which keep their own copy of the block tables): a new
    request's whole table and a resumed one's replace what the copy holds; otherwise the ids
    are appended to it (none: [])."""
    for data in out.scheduled_new_reqs:
        yield data.req_id, data.block_ids, True
    cached = out.scheduled_cached_reqs
    for rid, resumed, ids in zip(cached.req_ids, cached.resumed_from_preemption,
                                 cached.new_block_ids, strict=True):
        yield rid, ids or [], resumed
