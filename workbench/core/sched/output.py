"""SchedulerOutput: the plain record `Scheduler.schedule()` hands to the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.core.request import Request
from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata


@dataclass
class SchedulerOutput:
    """One step's plan.

    scheduled_requests: in batch order (running requests first, then newly admitted ones).
    num_scheduled_tokens: request_id -> new tokens to compute this step (incl. spec tokens).
    block_ids: request_id -> the request's whole block table (block ids in order).
    scheduled_spec_decode_tokens: request_id -> the draft tokens verified this step (the
        request's spec_token_ids, trimmed to the budget); only requests with drafts appear.
    blocks_to_copy: copy-on-write operations (src block id, dst block id) to run before the
        forward pass.
    finished_req_ids: requests finished (or aborted, or failed) since the previous
        schedule(): the worker drops its per-request state (sampling generators) for them
        before this step's batch, so a reused request id starts afresh.
    """

    scheduled_requests: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    block_ids: dict[str, list[int]] = field(default_factory=dict)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    kv_connector_metadata: KVConnectorMetadata | None = None  # the KV connector's transfers

    @property
    def total_num_scheduled_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def is_empty(self) -> bool:
        return not self.scheduled_requests
