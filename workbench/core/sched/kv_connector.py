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

The engine's own calls (`workbench.engine.kv_connector_bookkeeping`), on the same object:

    build:        set_xfer_handshake_metadata(worker's get_handshake_metadata()), when it has one
    failed step:  step_failed() (the forward raised: the step's planned transfers never ran)
    server:       transfer_info() (GET /kv_transfer_info); reset_cache()
                  (reset_prefix_cache(reset_connector=True))

`KVConnectorBase_V1` implements the optional ones as no-ops (vLLM's base does the same), so a
connector overrides only what it uses.
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

    # ---- called by the engine (KVConnectorBookkeeping), not the Scheduler ---------------
    def set_xfer_handshake_metadata(self, metadata: dict[str, Any]) -> None:
        """Once, when the engine is built: the worker side's `get_handshake_metadata()`
        (e.g. the P2pConnector's side channel, engine_id / host / port), when it is not None.
        vLLM's name; default: nothing to do."""
        ...

    def transfer_info(self) -> dict[str, Any] | None:
        """What a proxy must know to hand KV to or from this instance (the server's
        `GET /kv_transfer_info`); None: nothing (the default)."""
        ...

    def step_failed(self) -> None:
        """The step's forward raised (before the worker's report): forget the transfers
        `build_connector_meta` planned for it. Default: nothing to do."""
        ...

    def reset_cache(self) -> bool:
        """Empty the external tiers (`reset_prefix_cache(reset_connector=True)`, vLLM's
        name); False when something still in use stayed. Default: True (no tiers)."""
        ...
