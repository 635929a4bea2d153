"""The simulator's KV connectors: the scheduler side of vLLM's KV connector interface
(`core.sched.kv_connector.SchedulerConnector`), driving the real scheduler's connector paths
(external hits, WAITING_FOR_REMOTE_KVS, held blocks of a finished prefill leg) with no
worker behind them: a load is priced by its bytes on a `LinkQueue` instead of copied.

    SimConnector      every method a no-op (the base the others override)
    Load              one load the scheduler started: tokens, bytes, the link it crosses,
                      and (prefill/decode) the producer instance that holds the KV

Subclasses: `sim.pd.ProducerConnector` / `ConsumerConnector` (a prefill leg's KV handed to a
decode instance) and `sim.tiers.CPUTierConnector` (a host-memory tier of evicted blocks).
`SimInstance` takes each step's new loads (`take_loads`), times them on their link and
reports them done to the scheduler (`update_from_kv_xfer_finished`, vLLM's flow) at the first
step boundary at or after they end; `take_counters` adds the connector's counters (vLLM's and
the workbench's metric names) to the instance's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.distributed.kv_transfer.metadata import KVConnectorMetadata, KVConnectorOutput
from workbench.sim.transfer import LinkQueue

if TYPE_CHECKING:
    from workbench.core.request import Request
    from workbench.core.sched.output import SchedulerOutput


@dataclass
class Load:
    """One load: `num_tokens` tokens (`num_bytes` bytes) of `request_id`'s KV over `link`;
    `source` is the producer instance's index (prefill/decode), None for the instance's own
    tier. `asked_s` / `start_s` / `done_s` are set when the instance times it."""

    request_id: str
    num_tokens: int
    num_bytes: int
    link: LinkQueue | None
    source: int | None = None
    asked_s: float = 0.0
    start_s: float = 0.0
    done_s: float = 0.0


class SimConnector:
    """A scheduler-side connector that does nothing; `kv_bytes_per_token` prices loads."""

    def __init__(self, kv_bytes_per_token: int) -> None:
        if isinstance(kv_bytes_per_token, bool) or not isinstance(kv_bytes_per_token, int) \
                or kv_bytes_per_token < 1:
            raise ValueError(f"{type(self).__name__}: kv_bytes_per_token "
                             f"({kv_bytes_per_token!r}) must be an integer >= 1")
        self.kv_bytes_per_token = kv_bytes_per_token
        self._loads: list[Load] = []
        self._counters: dict[str, float] = {}

    # ---- the simulator's side
    def take_loads(self) -> list[Load]:
        """Loads started since the last call (in the order the scheduler started them)."""
        loads, self._loads = self._loads, []
        return loads

    def take_counters(self) -> dict[str, float]:
        """Counters since the last call (taking them resets them)."""
        counters, self._counters = self._counters, {}
        return counters

    def _count(self, name: str, value: float) -> None:
        self._counters[name] = self._counters.get(name, 0.0) + value

    # ---- SchedulerConnector (vLLM's names)
    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        return None

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return False, None

    def request_preempted(self, request: Request, block_ids: list[int]) -> bool:
        return False

    def has_pending_work(self) -> bool:
        return False

    def make_stats(self) -> dict[str, float]:
        return {}

    @property
    def host_usage(self) -> float:
        return 0.0

    def set_xfer_handshake_metadata(self, metadata: dict[str, Any]) -> None:
        return None

    def transfer_info(self) -> dict[str, Any] | None:
        return None

    def step_failed(self) -> None:
        return None

    def reset_cache(self) -> bool:
        return True
