"""KVConnectorBase_V1: vLLM's KV connector interface (v1), the methods this engine calls.

Scheduler side (in the engine process, called by `workbench.core.sched.scheduler.Scheduler`):
    get_num_new_matched_tokens(request, num_computed_tokens) -> (tokens, load_async)
        tokens the external tiers hold beyond the device cache's hit
    update_state_after_alloc(request, block_ids, num_external_tokens)
        the blocks the scheduler allocated: plan the load into them
    build_connector_meta(scheduler_output) -> KVConnectorMetadata
        this step's loads, stores (and swap-outs), for the worker
    update_connector_output(kv_connector_output)
        the worker's report: loads finished or failed, counters
    request_finished(request, block_ids) -> (delay_free_blocks, kv_transfer_params)
    (the rest of `workbench.core.sched.kv_connector.SchedulerConnector`, the Protocol this
    side satisfies: request_preempted, has_pending_work, make_stats, host_usage, and the
    engine's set_xfer_handshake_metadata, transfer_info, step_failed, reset_cache; all with
    defaults here)
Worker side (in the model runner):
    register_kv_caches(kv_caches)
    bind_connector_metadata(metadata); start_load_kv(); wait_for_layer_load(layer);
    save_kv_layer(layer, kv_layer); wait_for_save(); get_finished(finished_req_ids)
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata, KVConnectorOutput

if TYPE_CHECKING:
    import torch

    from workbench.core.request import Request
    from workbench.core.sched.output import SchedulerOutput


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorBase_V1(ABC):  # noqa: N801 - vLLM's name
    # True: the model runner calls save_kv_layer(i, cache) right after layer i has run,
    # inside the forward (a layer's copy overlaps the later layers); False: after the forward
    saves_layerwise = False

    def __init__(self, role: KVConnectorRole) -> None:
        self.role = role
        self._metadata: KVConnectorMetadata | None = None

    # ---- scheduler side ------------------------------------------------------------------
    @abstractmethod
    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]: ...

    @abstractmethod
    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata: ...

    def update_connector_output(self, output: KVConnectorOutput) -> None:  # noqa: B027
        """The worker's report of the last step (default: nothing to do)."""

    def step_failed(self) -> None:  # noqa: B027
        """The step's forward raised: forget the transfers planned for it."""

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """(delay freeing the blocks, kv_transfer_params for the client)."""
        return False, None

    def check_request(self, params: dict[str, Any], n: int) -> None:
        """Refuse a request's kv_transfer_params this connector cannot honour (before any
        work; ValueError)."""
        if params.get("do_remote_decode") or params.get("do_remote_prefill"):
            raise ValueError("kv_transfer_params do_remote_decode / do_remote_prefill need "
                             "kv_transfer_config's kv_connector 'P2pConnector' (a prefill or "
                             "decode instance)")

    def has_pending_work(self) -> bool:
        """True while the connector needs another step although no request runs."""
        return False

    def set_xfer_handshake_metadata(self, metadata: dict[str, Any]) -> None:  # noqa: B027
        """The worker side's `get_handshake_metadata()` (its side channel), vLLM's name."""

    def transfer_info(self) -> dict[str, Any] | None:
        """What a proxy must know to hand KV to or from this instance (None: nothing)."""
        return None

    def make_stats(self) -> dict[str, float]:
        """Scheduler-side counters since the last call (name -> increment)."""
        return {}

    @property
    def host_usage(self) -> float:
        """Share of the host tier holding blocks (0 without one)."""
        return 0.0

    def reset_cache(self) -> bool:
        """Empty the external tiers (`reset_prefix_cache(reset_connector=True)`)."""
        return True

    def request_preempted(self, request: Request, block_ids: list[int]) -> bool:
        """preemption_mode='swap': keep the request's KV outside the device pool; False
        when it cannot (it recomputes instead)."""
        return False

    # ---- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:  # noqa: B027
        """The device KV caches, one [2, num_blocks, block_size, Hkv, D] tensor per layer."""

    def get_handshake_metadata(self) -> dict[str, Any] | None:
        """What the scheduler side must know of this worker (None: nothing)."""
        return None

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        self._metadata = metadata

    def clear_connector_metadata(self) -> None:
        self._metadata = None

    @abstractmethod
    def start_load_kv(self) -> None: ...

    def wait_for_layer_load(self, layer: int) -> None:  # noqa: B027
        """Block until `layer`'s KV for this step's requests is in place."""

    @abstractmethod
    def save_kv_layer(self, layer: int, kv_layer: torch.Tensor) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    @abstractmethod
    def get_finished(self, finished_req_ids: set[str], wait: bool = False
                     ) -> KVConnectorOutput: ...

    def shutdown(self) -> None:  # noqa: B027
        """Stop background threads."""
