"""SchedulerConnector: the scheduler-side KV connector methods the Scheduler calls (vLLM's
`KVConnectorBase_V1` in the SCHEDULER role), as a Protocol so the torch-free core imports no
connector implementation. `workbench.distributed.kv_transfer.base.KVConnectorBase_V1`
satisfies it; the engine builds the connector (its factory) and hands it to the Scheduler.

    schedule():   get_num_new_matched_tokens(request, n) -> (external tokens, load_async)
                  update_state_after_alloc(request, block_ids, num_external_tokens)
                  build_connector_meta(scheduler_output) -> KVConnectorMetadata (to workers)
    preemption:   request_preempted(request, block_ids) (preemption_mode="swap")
    update:       update_connector_output(kv_connector_output) (loads done, sends read)
    finish:       request_finished(request, block_ids) -> (delay freeing, kv_transfer_params)
    stats:        make_stats(), host_usage; has_pending_work() keeps the engine stepping
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from workbench.core.request import Request
    from workbench.core.sched.output import SchedulerOutput
    from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata, KVConnectorOutput


class SchedulerConnector(Protocol):
    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]: ...

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None: ...

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata: ...

    def update_connector_output(self, output: KVConnectorOutput) -> None: ...

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]: ...

    def request_preempted(self, request: Request, block_ids: list[int]) -> bool: ...

    def has_pending_work(self) -> bool: ...

    def make_stats(self) -> dict[str, float]: ...

    @property
    def host_usage(self) -> float: ...
