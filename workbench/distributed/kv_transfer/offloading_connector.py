"""OffloadingConnector: the device KV cache backed by a host-memory tier (CPUOffloadingSpec)
and, with TieringOffloadingSpec, a disk tier shared by several engine instances.

Keys: a chain of sha256 hashes over `block_size`-token blocks (the connector's offload block
size, a multiple of the KV cache's), salted like the prefix cache, so a key vouches for the
whole prefix up to its block: an external hit is exact.

Scheduler side, per waiting request (after the device prefix-cache lookup, `num_computed`
tokens): the consecutive offloaded blocks from there that the host tier holds (ready), else
the disk tier holds, capped by `kv_transfer_params.max_load_tokens` and by the prompt minus
its last token (it is always recomputed, for the logits). The scheduler allocates device
blocks for them and parks the request in WAITING_FOR_REMOTE_KVS; the worker loads them on a
background thread while the step's forward runs; when the load is reported done the request
goes back to the waiting queue with those tokens computed (a failed load: recomputed).

Saves: every offloaded block a step completes (full, confirmed tokens) is written to a host
slot right after that step's forward (`wait_for_save`), and, tiering, through to the disk
folder on a writer thread. Host slots are evicted least recently used.

Swap (preemption_mode="swap"): a preempted request's blocks, the partial last one too, go to
anonymous host slots before the step's forward can reuse them, and come back as a load when
it is scheduled again (vLLM V0's swap; V1 recomputes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.config.kv_transfer import OffloadingConfig
from workbench.config.kv_transfer_params import kv_transfer_params
from workbench.core.kv_cache.hashing import BlockHash, extend_block_hashes, sha256_hash_fn
from workbench.core.sched.output import yield_req_data
from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole
from workbench.distributed.kv_transfer.disk_format import BadKVFile
from workbench.distributed.kv_transfer.metadata import (
    BlockCopy,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorStats,
    LoadJob,
    StoreJob,
)
from workbench.distributed.kv_transfer.tiers import DiskTier, HostTier

if TYPE_CHECKING:
    import torch

    from workbench.config import EngineConfig
    from workbench.core.request import Request
    from workbench.core.sched.output import SchedulerOutput

logger = logging.getLogger(__name__)


def kv_namespace(config: EngineConfig, block_size: int) -> str:
    """The disk tier's key prefix: the same for every instance serving the same weights with
    the same KV layout (so they share blocks), different otherwise."""
    mc = config.model_config
    ident = json.dumps({"hf_config": mc.hf_config, "dtype": config.torch_dtype_name,
                        "kv_cache_dtype": config.cache_config.kv_cache_dtype,
                        "block_size": block_size,
                        "quantization": mc.quantization}, sort_keys=True, default=str)
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def num_host_slots(cpu_bytes_to_use: int, bytes_per_device_block: int, group: int) -> int:
    return cpu_bytes_to_use // (bytes_per_device_block * group)


@dataclass
class _ReqState:
    hashes: list[BlockHash] = field(default_factory=list)  # offload-block key chain
    num_stored: int = 0  # leading offload blocks already saved (or found saved)
    load: LoadJob | None = None
    pinned: list[int] = field(default_factory=list)
    swap_slots: list[int] = field(default_factory=list)
    swap_tokens: int = 0
    lookup: tuple[int, int, int, int] = (0, 0, 0, 0)  # (queries, hits, host hits, disk hits)
    no_external: bool = False  # a load of it failed or timed out: recompute from now on
    # the scheduler's Request (from update_state_after_alloc) and this connector's copy of
    # its block table, kept from the step messages (vLLM's connectors keep the same)
    request: Request | None = None
    block_ids: list[int] = field(default_factory=list)


class OffloadingConnector(KVConnectorBase_V1):
    def __init__(self, config: EngineConfig, role: KVConnectorRole,
                 bytes_per_device_block: int) -> None:
        super().__init__(role)
        kt = config.kv_transfer_config
        assert kt is not None and not isinstance(kt, dict)
        off = kt.offloading
        assert isinstance(off, OffloadingConfig)
        self.extra = off
        self.device_block_size = config.cache_config.block_size
        self.block_size = off.block_size or self.device_block_size
        self.group = self.block_size // self.device_block_size
        self.num_slots = num_host_slots(off.cpu_bytes_to_use, bytes_per_device_block, self.group)
        self.namespace = off.namespace or kv_namespace(config, self.block_size)
        self.tiering = off.spec_name == "TieringOffloadingSpec"
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()
        else:
            self._init_worker()

    # ================================================================= scheduler side
    def _init_scheduler(self) -> None:
        self.host = HostTier(self.num_slots)
        self.disk: DiskTier | None = None
        if self.tiering:
            # OffloadingConfig refuses a TieringOffloadingSpec without a disk_path
            assert self.extra.disk_path is not None
            self.disk = DiskTier(self.extra.disk_path, self.namespace)
        self._reqs: dict[str, _ReqState] = {}
        self._loads: list[LoadJob] = []
        self._swap_out: list[StoreJob] = []
        self._release: list[int] = []
        self._inflight_stores: list[list[int]] = []  # slots per built step, oldest first
        # counters since the last make_stats(): vLLM's external prefix-cache queries/hits
        self.counters: dict[str, float] = {}

    def _count(self, name: str, value: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value

    def _state(self, request: Request) -> _ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState()
        st.request = request
        return st

    def _extend(self, request: Request, st: _ReqState, num_blocks: int) -> None:
        extend_block_hashes(sha256_hash_fn, st.hashes, request.all_token_ids,
                            self.block_size, num_blocks, request.cache_salt)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        st = self._state(request)
        if st.swap_slots:  # swapped out: everything it had computed comes back
            ext = max(0, st.swap_tokens - num_computed_tokens)
            st.lookup = (0, 0, 0, 0)
            return ext, ext > 0
        if request.sampling_params.prompt_logprobs is not None or st.no_external:
            st.lookup = (0, 0, 0, 0)
            return 0, False  # every prompt position's logits are computed
        params = kv_transfer_params(request.sampling_params.extra_args)
        bs, B = self.device_block_size, self.block_size  # noqa: N806
        num_tokens = len(request.all_token_ids)
        max_blocks = (num_tokens - 1) // B  # the last token is always recomputed
        self._extend(request, st, max_blocks)
        end = num_computed_tokens // B
        host_hits = disk_hits = 0
        while end < max_blocks:
            key = st.hashes[end]
            if self.host.lookup(key) is not None:
                host_hits += 1
            elif self.disk is not None and self.disk.holds(key):
                disk_hits += 1
            else:
                break
            end += 1
        hit_end = end * B
        if "max_load_tokens" in params:
            cap = num_computed_tokens + params["max_load_tokens"]
            hit_end = min(hit_end, cap - cap % bs)
        ext = max(0, hit_end - num_computed_tokens)
        st.lookup = (num_tokens, ext, host_hits, disk_hits)
        return ext, ext > 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        st = self._state(request)
        queries, hits, host_hits, disk_hits = st.lookup
        self._count("vllm:external_prefix_cache_queries", queries)
        self._count("vllm:external_prefix_cache_hits", hits)
        st.lookup = (0, 0, 0, 0)
        if num_external_tokens <= 0:
            return
        bs, g = self.device_block_size, self.group
        first = request.num_computed_tokens // bs
        last = -(-(request.num_computed_tokens + num_external_tokens) // bs)
        copies: list[BlockCopy] = []
        if st.swap_slots:
            for i in range(first, last):
                copies.append(("host", st.swap_slots[i // g], i % g, block_ids[i]))
            self._count("workbench:kv_swap_in_blocks", last - first)
        else:
            tier_tokens = {"host": 0, "disk": 0}
            for i in range(first, last):
                key = st.hashes[i // g]
                slot = self.host.lookup(key)
                if slot is not None:
                    if i == first or i % g == 0:
                        self.host.pin(slot)
                        self.host.touch(key)
                        st.pinned.append(slot)
                    copies.append(("host", slot, i % g, block_ids[i]))
                    tier_tokens["host"] += bs
                else:
                    copies.append(("disk", key.hex(), i % g, block_ids[i]))
                    tier_tokens["disk"] += bs
            self._count("workbench:kv_offload_host_hits", tier_tokens["host"])
            self._count("workbench:kv_offload_disk_hits", tier_tokens["disk"])
        st.load = LoadJob(request.request_id, copies, num_external_tokens)
        self._loads.append(st.load)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        B, g = self.block_size, self.group  # noqa: N806
        stores: list[StoreJob] = []
        step_slots: list[int] = []
        for rid, ids, replace in yield_req_data(scheduler_output):
            held = self._reqs.get(rid)
            if held is not None:
                if replace:
                    held.block_ids = list(ids)
                else:
                    held.block_ids.extend(ids)
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            st = self._reqs[rid]
            req = st.request
            assert req is not None  # every admitted request passed update_state_after_alloc
            valid = min(req.num_computed_tokens + n, len(req.all_token_ids))
            full = valid // B
            if full <= st.num_stored:
                continue
            self._extend(req, st, full)
            block_ids = st.block_ids
            for j in range(st.num_stored, full):
                key = st.hashes[j]
                slot, skipped = self.host.admit(key)
                if skipped:
                    self._count("workbench:kv_offload_store_skipped", 1)
                if slot is None:
                    continue
                step_slots.append(slot)
                disk_key = key.hex() if self.disk is not None and not self.disk.holds(key) \
                    else None
                stores.append(StoreJob(slot, list(block_ids[j * g:(j + 1) * g]), disk_key))
            st.num_stored = full
        self._inflight_stores.append(step_slots)
        meta = KVConnectorMetadata(loads=self._loads, stores=stores, swap_out=self._swap_out,
                                   release_slots=self._release)
        self._loads, self._swap_out, self._release = [], [], []
        return meta

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """After a step: its stores are in host memory (ready to load); finished or failed
        loads release their pins (a swapped request's slots go back to the pool)."""
        if self._inflight_stores:
            self.host.complete(self._inflight_stores.pop(0))
        for rid in output.finished_recving | output.failed_recving | output.timed_out_recving:
            st = self._reqs.get(rid)
            if st is None:
                continue
            st.no_external = st.no_external or rid not in output.finished_recving
            for slot in st.pinned:
                self.host.unpin(slot)
            st.pinned, st.load = [], None
            if st.swap_slots:
                self.host.release_anonymous(st.swap_slots)
                st.swap_slots, st.swap_tokens = [], 0
        self._count("workbench:kv_offload_failed_loads",
                    len(output.failed_recving) + len(output.timed_out_recving))

    def step_failed(self) -> None:
        """The step's forward raised: its stores never ran, their slots are dropped."""
        if self._inflight_stores:
            self.host.complete(self._inflight_stores.pop(0), ok=False)

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            for slot in st.pinned:
                self.host.unpin(slot)
            if st.swap_slots:
                self.host.release_anonymous(st.swap_slots)
        return False, None

    def request_preempted(self, request: Request, block_ids: list[int]) -> bool:
        st = self._state(request)
        g = self.group
        n = request.num_computed_tokens
        num_blocks = -(-n // self.device_block_size)
        if num_blocks == 0:
            return False
        slots = self.host.allocate_anonymous(-(-num_blocks // g))
        if slots is None:
            self._count("workbench:kv_swap_fallbacks", 1)
            return False
        for k, slot in enumerate(slots):
            self._swap_out.append(StoreJob(slot, list(block_ids[k * g:min((k + 1) * g,
                                                                           num_blocks)])))
        st.swap_slots, st.swap_tokens = slots, n
        st.num_stored = 0
        self._count("workbench:kv_swap_out_blocks", num_blocks)
        return True

    def reset_cache(self) -> bool:
        """vLLM's reset of the external caches (`reset_prefix_cache(reset_connector=True)`,
        the server's `?reset_external=true`): the host tier's blocks and the disk tier's
        files of this namespace; what a transfer in flight still uses stays."""
        done = self.host.reset()
        if self.disk is not None:
            done = self.disk.reset() and done
        for st in self._reqs.values():
            st.num_stored = 0  # stored blocks are gone: completed blocks are stored again
        return done

    def make_stats(self) -> dict[str, float]:
        out, self.counters = self.counters, {}
        return out

    @property
    def host_usage(self) -> float:
        return self.host.usage

    # =================================================================== worker side
    def _init_worker(self) -> None:
        self.pool: Any = None
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="kv-load")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kv-disk-write") \
            if self.tiering else None
        self._jobs: dict[str, tuple[Future[KVConnectorStats], float]] = {}
        self._timed_out: dict[str, Future[KVConnectorStats]] = {}
        self._disk_written = 0  # bytes since the last prune (disk_bytes_to_use)
        self._lock = threading.Lock()
        self._write_stats = KVConnectorStats()
        self._step_stats = KVConnectorStats()
        self._errors: list[str] = []

    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        from workbench.distributed.kv_transfer.host_pool import HostKVPool

        self.pool = HostKVPool(kv_caches, self.num_slots, self.group,
                               self.extra.disk_path if self.tiering else None, self.namespace)

    def start_load_kv(self) -> None:
        """Swap-outs first (their blocks may be reused by this step's forward), then each
        load on the loader thread."""
        meta = self._metadata
        if meta is None or self.pool is None:
            return
        for job in meta.swap_out:
            self.pool.store(job.slot, job.block_ids, self._step_stats, swap=True)
        for load in meta.loads:
            fut = self._loader.submit(self._load, load)
            self._jobs[load.req_id] = (fut, time.monotonic())

    def _load(self, load: LoadJob) -> KVConnectorStats:
        stats = KVConnectorStats()
        self.pool.load(load.copies, stats)
        return stats

    def save_kv_layer(self, layer: int, kv_layer: torch.Tensor) -> None:
        """Stores are written whole after the forward (`wait_for_save`); a layer-by-layer
        save from inside attention is the GPU overlap path, not built yet."""

    def wait_for_save(self) -> None:
        meta = self._metadata
        if meta is None or self.pool is None:
            return
        for job in meta.stores:
            self.pool.store(job.slot, job.block_ids, self._step_stats)
            if job.disk_key is not None and self._writer is not None:
                self._writer.submit(self._write, job.slot, job.disk_key)

    def _write(self, slot: int, key_hex: str) -> None:
        """Write one block through to disk; `disk_bytes_to_use` scans the folder now and
        then, and after a failed write (a full disk: the tier may be over its cap)."""
        stats = KVConnectorStats()
        failed = False
        try:
            self.pool.write_file(slot, key_hex, stats)
        except OSError as e:  # a dead or full store: the block stays in host memory only
            failed = True
            stats.failed_disk_writes += 1
            with self._lock:
                self._errors.append(f"disk write {key_hex[:12]}: {e}")
        cap = self.extra.disk_bytes_to_use
        if cap is not None:
            self._disk_written += stats.disk_write_bytes
            if failed or self._disk_written > cap // 10:
                self._disk_written = 0
                try:
                    stats.disk_pruned_files += self.pool.prune(cap)
                except OSError as e:
                    with self._lock:
                        self._errors.append(f"disk prune: {e}")
        with self._lock:
            self._write_stats.add(stats)

    def get_finished(self, finished_req_ids: set[str], wait: bool = False
                     ) -> KVConnectorOutput:
        """Loads done since the last call; `wait`: nothing else to do this step, so block
        until one is (no busy loop while every request waits for its KV)."""
        out = KVConnectorOutput(stats=self._step_stats)
        self._step_stats = KVConnectorStats()
        if wait and self._jobs:
            oldest = min(started for _, started in self._jobs.values())
            left = self.extra.load_timeout_s - (time.monotonic() - oldest)
            wait_futures([f for f, _ in self._jobs.values()], timeout=max(0.0, left),
                         return_when="FIRST_COMPLETED")
        now = time.monotonic()
        for rid, (fut, started) in list(self._jobs.items()):
            if fut.done():
                del self._jobs[rid]
                try:
                    out.stats.add(fut.result())
                    out.finished_recving.add(rid)
                except Exception as e:  # noqa: BLE001 - this request recomputes
                    out.failed_recving.add(rid)
                    out.stats.failed_loads += 1
                    if isinstance(e, BadKVFile):  # the files are removed already
                        out.stats.disk_bad_files += len(e.reasons)
                    out.errors.append(f"load for {rid} failed: {type(e).__name__}: {e}")
            elif now - started >= self.extra.load_timeout_s:
                # the copy may still write its blocks: the request recomputes on others,
                # these are released once the copy has ended
                del self._jobs[rid]
                self._timed_out[rid] = fut
                out.timed_out_recving.add(rid)
                out.errors.append(f"load for {rid} still running after "
                                  f"{self.extra.load_timeout_s:g} s")
        for rid, fut in list(self._timed_out.items()):
            if fut.done():
                del self._timed_out[rid]
                out.released.add(rid)
        with self._lock:
            out.stats.add(self._write_stats)
            self._write_stats = KVConnectorStats()
            out.errors.extend(self._errors)
            self._errors = []
        return out

    def flush(self) -> None:
        """Wait until every disk write queued so far is on disk (tests, shutdown)."""
        if self._writer is not None:
            self._writer.submit(lambda: None).result()

    def shutdown(self) -> None:
        if self.role == KVConnectorRole.WORKER:
            self._loader.shutdown(wait=True)
            if self._writer is not None:
                self._writer.shutdown(wait=True)
