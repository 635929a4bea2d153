"""The engine's side of the KV connector (kv_transfer_config): the handshake between the
scheduler side (in the Scheduler) and the worker side (in the model runner), the worker's
reports (loads finished or failed, blocks another instance has read, transfer counters), and
the step trace's KV columns. Without a connector every method is a no-op."""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole
from workbench.distributed.kv_transfer.factory import KVConnectorFactory

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.core.outputs import ModelRunnerOutput
    from workbench.core.sched.scheduler import Scheduler
    from workbench.distributed.kv_transfer.metadata import KVConnectorOutput
    from workbench.metrics.stats import EngineStats

logger = logging.getLogger(__name__)


def create_scheduler_connector(
    config: EngineConfig, bytes_per_block: int
) -> KVConnectorBase_V1 | None:
    """The scheduler side of the KV connector (None without a kv_transfer_config)."""
    return KVConnectorFactory.create_connector(config, KVConnectorRole.SCHEDULER,
                                               bytes_per_block)


class KVConnectorBookkeeping:
    def __init__(self, scheduler: Scheduler, runner: Any,
                 errors: deque[dict[str, Any]]) -> None:
        """`runner`: rank 0's model runner (its `kv_connector` is the worker side, made
        with the KV cache); `errors`: the engine's failure records."""
        self.scheduler = scheduler
        self.runner = runner
        self.errors = errors
        connector, worker = scheduler.connector, self.worker
        if connector is not None and worker is not None:
            handshake = worker.get_handshake_metadata()
            if handshake is not None:  # e.g. the P2pConnector's side channel
                connector.set_xfer_handshake_metadata(handshake)

    @property
    def worker(self) -> KVConnectorBase_V1 | None:
        return getattr(self.runner, "kv_connector", None)

    def transfer_info(self) -> dict[str, Any] | None:
        """The KV connector's side channel (disaggregation), None without one."""
        conn = self.scheduler.connector
        return conn.transfer_info() if conn is not None else None

    def step_failed(self) -> None:
        """The step's forward raised: the scheduler side forgets the transfers planned."""
        if self.scheduler.connector is not None:
            self.scheduler.connector.step_failed()

    def update_from_output(self, kv_out: KVConnectorOutput, stats: EngineStats,
                           step: int) -> None:
        """The worker's report: finished loads resume their requests, failed ones recompute
        (recorded in `errors`, scope "kv_transfer"); its counters into `stats`."""
        self.scheduler.update_from_kv_xfer_finished(kv_out)
        stats.record_kv_transfer(kv_out.stats, len(self.scheduler.sending))
        if kv_out.errors:
            for msg in kv_out.errors:
                logger.warning("KV transfer: %s (the request recomputes)", msg)
            self.errors.append({
                "step": step, "scope": "kv_transfer",
                "request_ids": sorted(kv_out.failed_recving), "message": kv_out.errors[0],
            })

    def poll(self, stats: EngineStats, step: int) -> None:
        """Between steps: take the worker's news now (a prefill instance frees the blocks
        decode instances have read since its last step; an idle engine does not step)."""
        worker = self.worker
        if worker is not None and self.scheduler.connector is not None:
            self.update_from_output(worker.get_finished(set()), stats, step)

    def step_fields(self, output: ModelRunnerOutput | None) -> dict[str, int]:
        """The step trace's KV bytes: loads finished and stores (+ swap-outs) of the step."""
        if self.scheduler.connector is None:
            return {}
        kv_out = output.kv_connector_output if output is not None else None
        st = kv_out.stats if kv_out is not None else None
        return {"kv_load_bytes": st.load_bytes if st else 0,
                "kv_store_bytes": (st.store_bytes + st.swap_out_bytes) if st else 0}

    def reset_cache(self) -> bool:
        """Empty the connector's tiers (True without a connector)."""
        conn = self.scheduler.connector
        return conn.reset_cache() if conn is not None else True
