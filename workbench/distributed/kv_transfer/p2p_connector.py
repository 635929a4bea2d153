"""P2pConnector: prefill/decode disaggregation, one instance's KV handed to another.

The flow is vLLM's NixlConnector's (a pull):

    proxy -> prefill instance (kv_producer): max_tokens=1,
             kv_transfer_params={"do_remote_decode": true, ...}
        the prompt is computed; when the request finishes by length its blocks are NOT
        freed (`request_finished` -> delay) and the response carries
        {"do_remote_prefill": true, "remote_engine_id", "remote_request_id",
         "remote_block_ids", "remote_host", "remote_port", "tp_size": 1}
    proxy -> decode instance (kv_consumer): the client's request + those params
        `get_num_new_matched_tokens` claims the prompt (all but its last token, which is
        recomputed for the logits) beyond the local prefix-cache hit; the scheduler
        allocates blocks and parks the request (WAITING_FOR_REMOTE_KVS); the worker reads the
        remote blocks over the transport into them; then the request decodes.
    prefill instance: the read (or an explicit release) ends the hold: the blocks are freed
        (`finished_sending`); blocks nobody reads within `abort_timeout_s` are freed too.

Failures: a read refused, cut, or not answered within `load_timeout_s` (the producer died,
restarted — its `engine_id` changes — or expired the blocks) fails the load: the decode
instance recomputes the prompt itself. Nothing is lost; tokens are the same (greedy).

Per request the consumer records bytes and wire seconds (`RequestTimes.kv_transfer_*`);
both sides count bytes, seconds, holds and failures (`workbench:kv_transfer_*` in /metrics).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole
from workbench.distributed.kv_transfer.metadata import (
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorStats,
)
from workbench.distributed.kv_transfer.offloading_connector import kv_namespace
from workbench.distributed.kv_transfer.p2p_transport import Reply, ZmqTransport
from workbench.kv_transfer_config import P2pConfig, kv_transfer_params

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.engine.request import Request
    from workbench.engine.scheduler_output import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass
class RemoteLoad:
    """One decode request's read: remote block i -> local block i. No local blocks: only
    tell the producer to release its hold (the decode instance had the prefix cached)."""

    req_id: str
    remote_host: str
    remote_port: int
    remote_engine_id: str
    remote_request_id: str
    remote_block_ids: list[int]
    local_block_ids: list[int]
    num_tokens: int


@dataclass
class P2pConnectorMetadata(KVConnectorMetadata):
    recv: list[RemoteLoad] = field(default_factory=list)
    send: dict[str, list[int]] = field(default_factory=dict)  # request -> held blocks


@dataclass
class _Recv:
    load: RemoteLoad
    params: dict[str, Any]


class P2pConnector(KVConnectorBase_V1):
    def __init__(self, config: EngineConfig, role: KVConnectorRole,
                 bytes_per_device_block: int) -> None:
        super().__init__(role)
        kt = config.kv_transfer_config
        assert kt is not None and not isinstance(kt, dict)
        extra = kt.p2p
        assert isinstance(extra, P2pConfig)
        self.extra = extra
        self.kt = kt
        self.block_size = config.cache_config.block_size
        self.namespace = kv_namespace(config, self.block_size)
        self.bytes_per_block = bytes_per_device_block
        self.engine_id = kt.engine_id or uuid.uuid4().hex[:16]
        self.host = extra.side_channel_host
        self.port = extra.side_channel_port
        if role == KVConnectorRole.SCHEDULER:
            self._consumed: set[str] = set()  # remote prefills already used (or refused)
            self._recv: list[RemoteLoad] = []
            self._announce: dict[str, list[int]] = {}  # holds the worker has not seen yet
            self.holding: set[str] = set()  # producer: requests whose blocks are held
            self.counters: dict[str, float] = {}
        else:
            self._init_worker()

    # ================================================================= scheduler side
    def set_xfer_handshake_metadata(self, metadata: dict[str, Any]) -> None:
        """The worker's side channel (vLLM's name): what the prefill response announces."""
        self.engine_id = metadata["engine_id"]
        self.host, self.port = metadata["host"], metadata["port"]

    def _count(self, name: str, value: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value

    def check_request(self, params: dict[str, Any], n: int) -> None:
        """Refuse a handshake this instance cannot honour, before any work."""
        if params.get("do_remote_decode") and not self.kt.is_kv_producer:
            raise ValueError(f"kv_transfer_params do_remote_decode needs a prefill instance "
                             f"(kv_role kv_producer or kv_both); this one is "
                             f"{self.kt.kv_role}")
        if params.get("do_remote_decode") and n > 1:
            raise ValueError(f"n ({n}) must be 1 with kv_transfer_params do_remote_decode "
                             "(one sequence's KV is handed over)")
        if params.get("do_remote_prefill") and not self.kt.is_kv_consumer:
            raise ValueError(f"kv_transfer_params do_remote_prefill needs a decode instance "
                             f"(kv_role kv_consumer or kv_both); this one is "
                             f"{self.kt.kv_role}")

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int, bool]:
        rid = request.request_id
        if rid in self._consumed or not self.kt.is_kv_consumer:
            return 0, False  # read once; after a preemption or a failed read: recompute
        params = kv_transfer_params(request.sampling_params.extra_args)
        if not params.get("do_remote_prefill"):
            return 0, False
        # everything the prefill instance computed except the last prompt token
        # (recomputed here for the first token's logits), as far as its blocks reach
        prompt_len = len(request.prompt_token_ids)
        reach = len(params["remote_block_ids"]) * self.block_size
        end = min(prompt_len - 1, reach)
        ext = max(0, end - num_computed_tokens)
        self._count("workbench:kv_transfer_recv_queries", 1)
        # with nothing to read, update_state_after_alloc still releases the producer's hold
        return ext, ext > 0

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        if rid in self._consumed or not self.kt.is_kv_consumer:
            return
        params = kv_transfer_params(request.sampling_params.extra_args)
        if not params.get("do_remote_prefill"):
            return
        self._consumed.add(rid)
        bs = self.block_size
        first = request.num_computed_tokens // bs
        last = -(-(request.num_computed_tokens + num_external_tokens) // bs) \
            if num_external_tokens > 0 else first
        remote = params["remote_block_ids"]
        self._recv.append(RemoteLoad(
            req_id=rid, remote_host=params["remote_host"], remote_port=params["remote_port"],
            remote_engine_id=params["remote_engine_id"],
            remote_request_id=params["remote_request_id"],
            remote_block_ids=list(remote[first:last]),
            local_block_ids=list(block_ids[first:last]), num_tokens=num_external_tokens))
        self._count("workbench:kv_transfer_recv_tokens", num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = P2pConnectorMetadata(recv=self._recv, send=self._announce)
        self._recv, self._announce = [], {}
        return meta

    def has_pending_work(self) -> bool:
        """Held blocks the worker has not been told about: one more step announces them."""
        return bool(self._announce)

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        self.holding -= output.finished_sending
        self._count("workbench:kv_transfer_failed_recvs",
                    len(output.failed_recving) + len(output.timed_out_recving))

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """A prefill leg that ran to its length keeps its blocks for the decode instance
        and returns where they are; anything else frees them as usual."""
        from workbench.engine.request import RequestStatus

        rid = request.request_id
        self._consumed.discard(rid)
        if not self.kt.is_kv_producer or not block_ids:
            return False, None
        params = kv_transfer_params(request.sampling_params.extra_args)
        if not params.get("do_remote_decode") or \
                request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            return False, None
        held = list(block_ids)
        self._announce[rid] = held
        self.holding.add(rid)
        self._count("workbench:kv_transfer_held_blocks", len(held))
        return True, {"do_remote_prefill": True, "do_remote_decode": False,
                      "remote_engine_id": self.engine_id, "remote_request_id": rid,
                      "remote_block_ids": held, "remote_host": self.host,
                      "remote_port": self.port, "tp_size": 1}

    def make_stats(self) -> dict[str, float]:
        out, self.counters = self.counters, {}
        return out

    # =================================================================== worker side
    def _init_worker(self) -> None:
        self.caches: list[torch.Tensor] = []
        self.transport = ZmqTransport(park_timeout_s=self.extra.load_timeout_s)
        self._reader = ThreadPoolExecutor(2, thread_name_prefix="kv-p2p-read")
        self._reads: dict[str, Future[tuple[int, float]]] = {}
        self._lock = threading.Lock()
        self._held: dict[str, tuple[list[int], float]] = {}  # request -> (blocks, deadline)
        self._sent: set[str] = set()
        # holds that ended (read or expired), newest last: a late read is refused at once
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._send_stats = KVConnectorStats()
        self._errors: list[str] = []

    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        self.caches = [c.view(torch.uint8) if c.dtype == torch.float8_e4m3fn else c
                       for c in kv_caches]
        two, _, bs, hkv, d = self.caches[0].shape
        self.layout = {"num_layers": len(self.caches), "block_shape": [two, bs, hkv, d],
                       "dtype": str(self.caches[0].dtype), "namespace": self.namespace}
        self.port = self.transport.start_server(self.host, self.port, self._serve)

    def get_handshake_metadata(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "host": self.host, "port": self.port}

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(metadata)
        assert isinstance(metadata, P2pConnectorMetadata)
        if metadata.send:
            deadline = time.monotonic() + self.extra.abort_timeout_s
            with self._lock:
                for rid, blocks in metadata.send.items():
                    self._held[rid] = (blocks, deadline)

    # ---- producer: the transport's handler (server thread) ------------------------------
    def _serve(self, header: dict[str, Any]) -> Reply | None:
        if header.get("engine_id") != self.engine_id:
            return Reply({"ok": False, "error": f"engine_id {header.get('engine_id')!r} is "
                          f"not this instance's ({self.engine_id}): it restarted?"})
        if header.get("namespace") != self.namespace:
            return Reply({"ok": False, "error": "the KV layout differs (model, dtype, "
                          "kv_cache_dtype or block_size)"})
        rid = header.get("request_id")
        with self._lock:
            entry = self._held.get(rid)  # type: ignore[arg-type]
            gone = self._gone.get(rid)  # type: ignore[arg-type]
        if entry is None and gone is not None:
            return Reply({"ok": False, "error": f"the blocks of {rid!r} were {gone}"})
        if entry is None:
            return None  # not announced yet: parked, refused after the timeout
        held, _ = entry
        if header.get("op") == "release":
            return Reply({"ok": True}, on_sent=lambda: self._done_sending(rid, 0, 0.0))
        ids = header.get("block_ids")
        if not isinstance(ids, list) or not set(ids) <= set(held):
            return Reply({"ok": False, "error": f"block_ids {ids!r} are not the blocks held "
                          f"for {rid!r}"})
        t0 = time.perf_counter()
        index = torch.tensor(ids, dtype=torch.long, device=self.caches[0].device)
        frames = []
        for cache in self.caches:
            part = cache.index_select(1, index).contiguous().cpu()
            frames.append(part.view(torch.uint8).numpy())
        nbytes = sum(f.nbytes for f in frames)
        dt = time.perf_counter() - t0
        return Reply({"ok": True, "layout": self.layout, "num_blocks": len(ids)}, frames,
                     on_sent=lambda: self._done_sending(rid, nbytes, dt))

    def _done_sending(self, rid: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            if self._held.pop(rid, None) is None:
                return
            self._forget(rid, "already read")
            self._sent.add(rid)
            self._send_stats.send_bytes += nbytes
            self._send_stats.send_time_s += seconds

    def _forget(self, rid: str, why: str) -> None:
        """Under the lock: remember why a hold ended (the newest 4096)."""
        self._gone[rid] = why
        while len(self._gone) > 4096:
            self._gone.popitem(last=False)

    # ---- consumer ---------------------------------------------------------------------
    def start_load_kv(self) -> None:
        meta = self._metadata
        if not isinstance(meta, P2pConnectorMetadata):
            return
        for load in meta.recv:
            self._reads[load.req_id] = self._reader.submit(self._read, load)

    def _read(self, load: RemoteLoad) -> tuple[int, float]:
        header = {"op": "read" if load.local_block_ids else "release",
                  "engine_id": load.remote_engine_id, "namespace": self.namespace,
                  "request_id": load.remote_request_id, "block_ids": load.remote_block_ids}
        t0 = time.perf_counter()
        reply, frames = self.transport.read(load.remote_host, load.remote_port, header,
                                            self.extra.load_timeout_s)
        if not load.local_block_ids:
            return 0, time.perf_counter() - t0
        if reply.get("layout") != self.layout or len(frames) != len(self.caches):
            raise RuntimeError(f"the producer's KV layout {reply.get('layout')} differs from "
                               f"this instance's {self.layout}")
        n = len(load.local_block_ids)
        two, bs, hkv, d = self.layout["block_shape"]
        dev = self.caches[0].device
        index = torch.tensor(load.local_block_ids, dtype=torch.long, device=dev)
        nbytes = 0
        with warnings.catch_warnings():  # zmq frames are read-only; they are only copied
            warnings.simplefilter("ignore", UserWarning)
            for cache, frame in zip(self.caches, frames, strict=True):
                raw = torch.frombuffer(frame, dtype=torch.uint8)
                part = raw.view(cache.dtype).view(two, n, bs, hkv, d)
                cache.index_copy_(1, index, part.to(dev, non_blocking=False))
                nbytes += raw.numel()
        return nbytes, time.perf_counter() - t0

    def save_kv_layer(self, layer: int, kv_layer: torch.Tensor) -> None:
        """The producer's blocks are read in place (held), nothing to save per layer."""

    def wait_for_save(self) -> None:
        """Nothing is written out: the decode instance reads the held blocks."""

    def get_finished(self, finished_req_ids: set[str], wait: bool = False
                     ) -> KVConnectorOutput:
        out = KVConnectorOutput()
        if wait and self._reads:
            wait_futures(list(self._reads.values()), timeout=self.extra.load_timeout_s,
                         return_when="FIRST_COMPLETED")
        for rid, fut in list(self._reads.items()):
            if not fut.done():
                continue
            del self._reads[rid]
            try:
                nbytes, seconds = fut.result()
            except Exception as e:  # noqa: BLE001 - this request recomputes its prompt
                out.failed_recving.add(rid)
                out.stats.failed_loads += 1
                out.errors.append(f"read for {rid} failed: {type(e).__name__}: {e}")
                continue
            out.finished_recving.add(rid)
            out.recv_info[rid] = (nbytes, seconds)
            out.stats.recv_bytes += nbytes
            out.stats.recv_time_s += seconds
        now = time.monotonic()
        with self._lock:
            for rid, (_, deadline) in list(self._held.items()):
                if now >= deadline:  # nobody read them: free (vLLM's abort timeout)
                    del self._held[rid]
                    self._forget(rid, f"freed after abort_timeout_s "
                                      f"({self.extra.abort_timeout_s:g} s)")
                    self._sent.add(rid)
                    self._send_stats.expired_sends += 1
                    self._errors.append(f"blocks held for {rid} were not read within "
                                        f"{self.extra.abort_timeout_s:g} s: freed")
            out.finished_sending, self._sent = self._sent, set()
            out.stats.add(self._send_stats)
            self._send_stats = KVConnectorStats()
            out.errors.extend(self._errors)
            self._errors = []
        return out

    def shutdown(self) -> None:
        if self.role == KVConnectorRole.WORKER:
            self._reader.shutdown(wait=True)
            self.transport.close()
