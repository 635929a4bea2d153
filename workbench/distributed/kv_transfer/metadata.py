"""What crosses the scheduler/worker boundary for a KV connector (vLLM's names).

A shared leaf: `SchedulerOutput.kv_connector_metadata` carries a `KVConnectorMetadata` down,
`ModelRunnerOutput.kv_connector_output` carries a `KVConnectorOutput` back up.

A copy is one device block and one place in an external tier:
    (tier, ref, sub, block_id)
    tier "host": ref = host slot, sub = which device block of the slot's group
    tier "disk": ref = the block's key (hex), sub as above
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BlockCopy = tuple[str, Any, int, int]  # (tier, ref, sub, device block id)


@dataclass
class LoadJob:
    """One request's load: device blocks filled from the tiers before it may run."""

    req_id: str
    copies: list[BlockCopy]
    num_tokens: int  # tokens this load makes computed


@dataclass
class StoreJob:
    """One offloaded block (a host slot) written from its device blocks after the forward;
    `disk_key` also writes it through to the disk tier."""

    slot: int
    block_ids: list[int]
    disk_key: str | None = None


@dataclass
class KVConnectorMetadata:
    """One step's transfers, built by the scheduler-side connector."""

    loads: list[LoadJob] = field(default_factory=list)
    stores: list[StoreJob] = field(default_factory=list)
    swap_out: list[StoreJob] = field(default_factory=list)  # before the forward, in order
    release_slots: list[int] = field(default_factory=list)  # slots now unused


@dataclass
class KVConnectorStats:
    """Transfer counters of one step (worker side): bytes and seconds per direction."""

    load_bytes: int = 0
    load_time_s: float = 0.0
    store_bytes: int = 0
    store_time_s: float = 0.0
    disk_read_bytes: int = 0
    disk_read_time_s: float = 0.0
    disk_write_bytes: int = 0
    disk_write_time_s: float = 0.0
    swap_out_bytes: int = 0
    swap_out_time_s: float = 0.0
    failed_loads: int = 0
    failed_disk_writes: int = 0
    disk_bad_files: int = 0  # disk-tier files that failed their check (removed)
    disk_pruned_files: int = 0  # disk-tier files deleted by disk_bytes_to_use
    # P2pConnector: KV received from / sent to another instance, and the wire seconds
    recv_bytes: int = 0
    recv_time_s: float = 0.0
    send_bytes: int = 0
    send_time_s: float = 0.0
    expired_sends: int = 0  # blocks nobody read within abort_timeout_s (freed)
    sends: int = 0  # holds / buffers read (or released) by a decode instance
    send_wait_s: float = 0.0  # their waits: the prefill leg's end -> the read served
    stage_bytes: int = 0  # layerwise: copied to the host send buffer during the forward
    stage_time_s: float = 0.0  # seconds of those copies (off the forward's critical path)
    push_bytes: int = 0  # push: staged KV sent to the decode instance during the prefill
    push_time_s: float = 0.0  # seconds handing those slices to the transport
    push_drops: int = 0  # legs whose push did not arrive whole (the decode side pulls)
    pushed_loads: int = 0  # decode side: loads served from pushed KV (no pull)

    def add(self, other: KVConnectorStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class KVConnectorOutput:
    """What the worker-side connector reports after a step: loads finished (their requests
    may run), loads that failed or timed out (they recompute), and the step's counters."""

    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    # still copying after load_timeout_s: the request recomputes on other blocks; its old
    # blocks are reported in `released` once the copy has ended (then they may be reused)
    timed_out_recving: set[str] = field(default_factory=set)
    released: set[str] = field(default_factory=set)
    # producer side (vLLM's name): requests whose held blocks were read (or expired): the
    # scheduler frees them now
    finished_sending: set[str] = field(default_factory=set)
    # per finished load: (bytes, seconds on the wire) for the request's timeline
    recv_info: dict[str, tuple[int, float]] = field(default_factory=dict)
    stats: KVConnectorStats = field(default_factory=KVConnectorStats)
    errors: list[str] = field(default_factory=list)
