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

Layerwise (`kv_connector_extra_config.layerwise`): the producer copies a prefill leg's KV
to a host send buffer layer by layer from inside the forward (`save_kv_layer` right after
each layer; the copy runs on a copy thread / CUDA stream while the later layers compute),
chunk by chunk under chunked prefill; the request's device blocks are freed when it finishes
(no hold), and reads are served from the buffer. A leg that does not fit `send_buffer_bytes`
falls back to the hold.

Push (`layerwise` plus a prefill request naming the decode instance's side channel in its
`remote_host`/`remote_port`): each staged slice also goes straight to the decode instance
while the prefill runs (`p2p_push`); its read then finds the KV in its inbox and only
releases the producer's buffer. A push that did not arrive whole falls back to the pull.

Failures: a read refused, cut, or not answered within `load_timeout_s` (the producer died,
restarted — its `engine_id` changes — or expired the blocks) fails the load: the decode
instance recomputes the prompt itself. Nothing is lost; tokens are the same (greedy).

Checks (`p2p_trust`): each hold is tied to its prompt (`prompt_digest` in the handshake and in
each read; a read for another prompt is refused: a failed load, recomputed); a decode
instance connects only to trusted producers (this host, or `trusted_producers`; another one
named in a request is not contacted: a failed load, recomputed). A read of a request the
producer never had (or no longer has) is refused at once; only a prefill leg still running
(announced to the worker when it is first scheduled) or finished but not yet announced as
held is parked until it is.

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

from workbench.config.kv_transfer import P2pConfig
from workbench.config.kv_transfer_params import kv_transfer_params
from workbench.core.sched.output import yield_req_data
from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole
from workbench.distributed.kv_transfer.host_pool import bytes_view
from workbench.distributed.kv_transfer.metadata import (
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorStats,
)
from workbench.distributed.kv_transfer.offloading_connector import kv_namespace
from workbench.distributed.kv_transfer.p2p_push import PushInbox, PushSender
from workbench.distributed.kv_transfer.p2p_transport import (
    KVTransport,
    Reply,
    TransferError,
    ZmqTransport,
)
from workbench.distributed.kv_transfer.p2p_trust import PeerTrust, own_hosts, prompt_digest

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.core.request import Request
    from workbench.core.sched.output import SchedulerOutput


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
    prompt_digest: str  # this request's prompt: the producer serves only that prompt's KV
    remote_prompt_digest: str | None = None  # the handshake's (the producer's prompt)
    pushed: bool = False  # the producer pushed this KV here: wait for it to land


@dataclass
class StageJob:
    """Layerwise: copy device blocks `block_ids` (the request's blocks `first`.. of the
    prompt) into the request's send buffer of `num_blocks` blocks; `last`: the prompt is
    complete after this step (the buffer may be read)."""

    req_id: str
    first: int
    block_ids: list[int]
    num_blocks: int
    last: bool
    push_to: tuple[str, int] | None = None  # the decode instance's side channel
    prompt_digest: str = ""  # the leg's prompt (sent with each push)


@dataclass
class P2pConnectorMetadata(KVConnectorMetadata):
    recv: list[RemoteLoad] = field(default_factory=list)
    send: dict[str, list[int]] = field(default_factory=dict)  # request -> held blocks
    stage: list[StageJob] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)  # staged buffers nobody will read
    # prefill legs first scheduled (request -> prompt digest): a read of one is parked
    # until it is held; legs that ended without a hand-over: a read is refused at once
    legs: dict[str, str] = field(default_factory=dict)
    ended: list[str] = field(default_factory=list)


@dataclass
class _Stage:
    """Scheduler side, layerwise: a prefill leg's send buffer."""

    num_blocks: int
    push_to: tuple[str, int] | None = None  # push each staged slice there
    prompt_digest: str = ""
    staged_full: int = 0  # leading full blocks copied (final)
    complete: bool = False  # every prompt block copied


@dataclass
class _Buffer:
    """Worker side, layerwise: a prefill leg's KV on the host, one [2, num_blocks,
    block_size, Hkv, D] tensor per layer; readable once the prompt is complete."""

    layers: list[torch.Tensor]
    deadline: float | None = None  # set when complete: freed if nobody read it by then


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
        self.saves_layerwise = extra.layerwise and kt.is_kv_producer
        local = own_hosts(self.host)
        self.trust = PeerTrust(extra.trusted_producers, local, "trusted_producers")
        self.push_trust = PeerTrust(extra.trusted_consumers, local, "trusted_consumers")
        if role == KVConnectorRole.SCHEDULER:
            self._consumed: set[str] = set()  # remote prefills already used (or refused)
            self._recv: list[RemoteLoad] = []
            self._announce: dict[str, list[int]] = {}  # holds the worker has not seen yet
            self.counters: dict[str, float] = {}
            self._stages: dict[str, _Stage | None] = {}  # None: not staged (not a leg/no room)
            self._stage_jobs: list[StageJob] = []
            self._drop: list[str] = []
            self.buffer_used = 0  # bytes of send buffers in use (freed when read/expired)
            self._buffer_bytes: dict[str, int] = {}
            self._legs: dict[str, str] = {}  # prefill legs seen -> prompt digest
            self._new_legs: dict[str, str] = {}  # ... the worker has not been told about
            self._ended: list[str] = []  # ... that ended without a hand-over
            # layerwise: the scheduler's Requests (update_state_after_alloc) and this
            # connector's copy of their block tables, kept from the step messages
            self._requests: dict[str, Request] = {}
            self._block_ids: dict[str, list[int]] = {}
        else:
            self._init_worker()

    # ================================================================= scheduler side
    def set_xfer_handshake_metadata(self, metadata: dict[str, Any]) -> None:
        """The worker's side channel (vLLM's name): what the prefill response announces."""
        self.engine_id = metadata["engine_id"]
        self.host, self.port = metadata["host"], metadata["port"]

    def transfer_info(self) -> dict[str, Any]:
        """`GET /kv_transfer_info`: the side channel a proxy names in a prefill request to
        have the KV pushed here (`layerwise`: this instance pushes its prefills)."""
        return {"kv_connector": "P2pConnector", "kv_role": self.kt.kv_role,
                "engine_id": self.engine_id, "side_channel_host": self.host,
                "side_channel_port": self.port, "layerwise": self.saves_layerwise}

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
        if self.kt.is_kv_producer and rid not in self._legs:
            self._note_leg(request)
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

    def _note_leg(self, request: Request) -> None:
        """A prefill leg is about to be scheduled: the worker learns it with this step (before
        the forward, so before any decode instance can know its request id)."""
        params = kv_transfer_params(request.sampling_params.extra_args)
        if params.get("do_remote_decode"):
            digest = prompt_digest(request.prompt_token_ids, request.cache_salt)
            self._legs[request.request_id] = self._new_legs[request.request_id] = digest

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        rid = request.request_id
        if self.saves_layerwise:
            self._requests[rid] = request
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
            local_block_ids=list(block_ids[first:last]), num_tokens=num_external_tokens,
            prompt_digest=prompt_digest(request.prompt_token_ids, request.cache_salt),
            remote_prompt_digest=params.get("prompt_digest"),
            pushed=params.get("pushed_to") == f"{self.host}:{self.port}"))
        self._count("workbench:kv_transfer_recv_tokens", num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        if self.saves_layerwise:
            self._plan_stages(scheduler_output)
        meta = P2pConnectorMetadata(recv=self._recv, send=self._announce,
                                    stage=self._stage_jobs, drop=self._drop,
                                    legs=self._new_legs, ended=self._ended)
        self._recv, self._announce, self._stage_jobs, self._drop = [], {}, [], []
        self._new_legs, self._ended = {}, []
        return meta

    def _plan_stages(self, out: SchedulerOutput) -> None:
        """Layerwise: the prompt blocks each prefill leg's step writes (from the first not
        yet final one: a partial block is copied again when the next chunk fills it)."""
        bs = self.block_size
        tables = self._block_ids
        for rid, ids, replace in yield_req_data(out):
            if replace:
                tables[rid] = list(ids)
            else:
                tables[rid].extend(ids)
        for rid, n in out.num_scheduled_tokens.items():
            req = self._requests[rid]
            if rid not in self._stages:
                self._stages[rid] = self._new_stage(req)
            st = self._stages[rid]
            if st is None or st.complete:
                continue
            prompt = len(req.prompt_token_ids)
            end = min(req.num_computed_tokens + n, prompt)
            last = -(-end // bs)
            ids = tables[rid]
            st.complete = end == prompt
            self._stage_jobs.append(StageJob(rid, st.staged_full, list(ids[st.staged_full:last]),
                                             st.num_blocks, st.complete, st.push_to,
                                             st.prompt_digest))
            st.staged_full = end // bs

    def _new_stage(self, req: Request) -> _Stage | None:
        params = kv_transfer_params(req.sampling_params.extra_args)
        if not params.get("do_remote_decode"):
            return None
        num_blocks = -(-len(req.prompt_token_ids) // self.block_size)
        nbytes = num_blocks * self.bytes_per_block
        if self.buffer_used + nbytes > self.extra.send_buffer_bytes:
            self._count("workbench:kv_transfer_stage_fallbacks", 1)
            return None  # no room: this leg holds its device blocks instead
        self.buffer_used += nbytes
        self._buffer_bytes[req.request_id] = nbytes
        host, port = params.get("remote_host"), params.get("remote_port")
        if host and port and not self.push_trust.allows(host, port):
            logger.warning("request %s: push target %s:%s is not a decode instance this one "
                           "trusts (%s): not pushed (it pulls); list it in kv_transfer_config "
                           "kv_connector_extra_config trusted_consumers", req.request_id,
                           host, port, self.push_trust.describe())
            self._count("workbench:kv_transfer_push_drops", 1)
            host = port = None
        digest = self._legs.get(req.request_id)  # noted at its lookup (_note_leg)
        if digest is None:
            digest = prompt_digest(req.prompt_token_ids, req.cache_salt)
        return _Stage(num_blocks, (host, port) if host and port else None, digest)

    def has_pending_work(self) -> bool:
        """Held blocks the worker has not been told about: one more step announces them."""
        return bool(self._announce or self._drop or self._new_legs or self._ended)

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for rid in output.finished_sending:  # a send buffer read, expired or dropped
            self.buffer_used -= self._buffer_bytes.pop(rid, 0)
        self._count("workbench:kv_transfer_failed_recvs",
                    len(output.failed_recving) + len(output.timed_out_recving))

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """A prefill leg that ran to its length keeps its blocks for the decode instance
        and returns where they are; anything else frees them as usual."""
        from workbench.core.request import RequestStatus

        rid = request.request_id
        self._consumed.discard(rid)
        self._requests.pop(rid, None)
        self._block_ids.pop(rid, None)
        digest = self._legs.pop(rid, None) if self.kt.is_kv_producer else None
        stage = self._stages.pop(rid, None) if self.saves_layerwise else None
        params = kv_transfer_params(request.sampling_params.extra_args)
        handed = bool(block_ids) and digest is not None and params.get("do_remote_decode") \
            and request.status == RequestStatus.FINISHED_LENGTH_CAPPED
        if stage is not None and not (handed and stage.complete):
            self._drop.append(rid)  # staged, but nobody will read it
            handed = False
        if not handed:
            if digest is not None:  # a read of it is refused at once from now on
                self._new_legs.pop(rid, None)
                self._ended.append(rid)
            return False, None
        assert digest is not None
        # layerwise: the buffer has the KV and the blocks go free now; its blocks are named
        # by their place in the buffer
        held = list(block_ids) if stage is None else list(range(stage.num_blocks))
        delay = stage is None
        if delay:
            self._announce[rid] = held
            self._count("workbench:kv_transfer_held_blocks", len(held))
        out = {"do_remote_prefill": True, "do_remote_decode": False,
               "remote_engine_id": self.engine_id, "remote_request_id": rid,
               "remote_block_ids": held, "remote_host": self.host, "remote_port": self.port,
               "tp_size": 1, "prompt_digest": digest}
        if stage is not None and stage.push_to is not None:
            out["pushed_to"] = f"{stage.push_to[0]}:{stage.push_to[1]}"
        return delay, out

    def make_stats(self) -> dict[str, float]:
        out, self.counters = self.counters, {}
        return out

    # =================================================================== worker side
    def _init_worker(self) -> None:
        self.caches: list[torch.Tensor] = []
        self.transport: KVTransport
        if self.extra.transport == "torch_dist":  # control over ZeroMQ, KV over gloo / NCCL
            from workbench.distributed.kv_transfer.p2p_torch_transport import (
                TorchDistTransport,
            )

            self.transport = TorchDistTransport(park_timeout_s=self.extra.load_timeout_s,
                                                backend=self.extra.torch_dist_backend)
        else:
            self.transport = ZmqTransport(park_timeout_s=self.extra.load_timeout_s)
        self._reader = ThreadPoolExecutor(2, thread_name_prefix="kv-p2p-read")
        self._reads: dict[str, Future[tuple[int, float, bool]]] = {}
        self._lock = threading.Lock()
        self._held: dict[str, tuple[list[int], float]] = {}  # request -> (blocks, deadline)
        self._sent: set[str] = set()
        self._buffers: dict[str, _Buffer] = {}  # layerwise send buffers
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="kv-p2p-stage") \
            if self.saves_layerwise else None
        self._copies: list[Future[float]] = []
        self._copy_stream: Any = None
        self._inbox: PushInbox | None = None  # consumer: KV pushed before its request came
        self._sender: PushSender | None = None  # layerwise producer: pushes slices
        # holds that ended (read or expired), newest last: a late read is refused at once
        self._gone: OrderedDict[str, str] = OrderedDict()
        # prefill legs from their first step until their hold or buffer ends -> the prompt's
        # digest; a read of a request not here (nor gone) is refused at once
        self._legs = {}  # (declared with the scheduler side's: request -> prompt digest)
        self._send_stats = KVConnectorStats()
        self._errors: list[str] = []

    def register_kv_caches(self, kv_caches: list[torch.Tensor]) -> None:
        self.caches = [bytes_view(c) for c in kv_caches]
        two, _, bs, hkv, d = self.caches[0].shape
        self.layout: dict[str, Any] = {
            "num_layers": len(self.caches), "block_shape": [two, bs, hkv, d],
            "dtype": str(self.caches[0].dtype), "namespace": self.namespace}
        if self.kt.is_kv_consumer:
            self._inbox = PushInbox(self.layout, self.caches[0].dtype,
                                    self.extra.push_inbox_bytes, self.extra.abort_timeout_s)
        if self.saves_layerwise:
            self._sender = PushSender(self.transport.pusher(), self.engine_id, self.layout)
        self.transport.register_kv_caches(self.caches)
        self.port = self.transport.start_server(
            self.host, self.port, self._serve,
            self._take_push if self._inbox is not None else None)
        if self.saves_layerwise and self.caches[0].device.type == "cuda":
            self._copy_stream = torch.cuda.Stream(device=self.caches[0].device)

    def get_handshake_metadata(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "host": self.host, "port": self.port}

    def bind_connector_metadata(self, metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(metadata)
        assert isinstance(metadata, P2pConnectorMetadata)
        if metadata.legs or metadata.ended:
            with self._lock:
                self._legs.update(metadata.legs)
                for rid in metadata.ended:
                    if self._legs.pop(rid, None) is not None:
                        self._forget(rid, "not handed over (its prefill did not finish by "
                                     "length: aborted, stopped or failed)")
        if metadata.send:
            deadline = time.monotonic() + self.extra.abort_timeout_s
            with self._lock:
                for rid, blocks in metadata.send.items():
                    self._held[rid] = (blocks, deadline)
        if metadata.drop:
            with self._lock:
                for rid in metadata.drop:
                    if self._buffers.pop(rid, None) is not None:
                        self._sent.add(rid)  # the scheduler's buffer bytes come back
            if self._copier is not None and self._sender is not None:
                for rid in metadata.drop:
                    self._copier.submit(self._sender.forget, rid)
        for job in metadata.stage:
            if job.req_id not in self._buffers:
                two, _, bs, hkv, d = self.caches[0].shape
                pin = self.caches[0].device.type == "cuda"
                layers = [torch.empty((two, job.num_blocks, bs, hkv, d), dtype=c.dtype,
                                      pin_memory=pin) for c in self.caches]
                with self._lock:
                    self._buffers[job.req_id] = _Buffer(layers)

    # ---- producer: the transport's handler (server thread) ------------------------------
    def _serve(self, header: dict[str, Any]) -> Reply | None:
        if header.get("engine_id") != self.engine_id:
            return Reply({"ok": False, "error": f"engine_id {header.get('engine_id')!r} is "
                          f"not this instance's ({self.engine_id}): it restarted?"})
        if header.get("namespace") != self.namespace:
            return Reply({"ok": False, "error": "the KV layout differs (model, dtype, "
                          "kv_cache_dtype or block_size)"})
        rid = header.get("request_id")
        if not isinstance(rid, str):  # no prefill leg has such an id
            return self._unknown_request(rid)
        with self._lock:
            buf = self._buffers.get(rid)
            staged = buf is not None and buf.deadline is not None  # complete: readable
            entry = self._held.get(rid)
            gone = self._gone.get(rid)
            digest = self._legs.get(rid)
        if gone is not None and not staged and entry is None:
            return Reply({"ok": False, "error": f"the blocks of {rid!r} were {gone}"})
        if digest is None:  # never a prefill leg here: nothing will come; say so at once
            return self._unknown_request(rid)
        if header.get("prompt_digest") != digest:
            return Reply({"ok": False, "error": f"prompt_digest "
                          f"{str(header.get('prompt_digest'))[:16]!r}... is not the prompt "
                          f"held for {rid!r}: refused (the decode request's prompt differs "
                          "from the prefill's)"})
        if not staged and entry is None:
            return None  # running, or finished and not announced yet: parked until it is
        if header.get("op") == "release":
            return Reply({"ok": True}, on_sent=lambda: self._done_sending(rid, 0, 0.0))
        ids = header.get("block_ids")
        if staged:  # a layerwise send buffer: blocks named by their place in it
            assert buf is not None
            layers, n = buf.layers, buf.layers[0].shape[1]
            valid = isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < n
                                                  for i in ids)
            where = f"places in the {n}-block send buffer of {rid!r}"
        else:  # held device blocks
            assert entry is not None
            layers = self.caches
            valid = isinstance(ids, list) and set(ids) <= set(entry[0])
            where = f"the blocks held for {rid!r}"
        if not (valid and isinstance(ids, list)):  # (valid implies a list; this narrows ids)
            return Reply({"ok": False, "error": f"block_ids {ids!r} are not {where}"})
        t0 = time.perf_counter()
        index = torch.tensor(ids, dtype=torch.long, device=layers[0].device)
        # Reply's payload frames: device tensors, or host arrays when bytes go on the wire
        frames: list[Any] = [layer.index_select(1, index) for layer in layers]
        if not self.transport.tensor_frames:  # bytes on the wire: host copies
            frames = [f.cpu().view(torch.uint8).numpy() for f in frames]
        nbytes = sum(f.nbytes for f in frames)
        dt = time.perf_counter() - t0
        return Reply({"ok": True, "layout": self.layout, "num_blocks": len(ids)}, frames,
                     on_sent=lambda: self._done_sending(rid, nbytes, dt))

    @staticmethod
    def _unknown_request(rid: Any) -> Reply:
        return Reply({"ok": False, "error": f"unknown request {rid!r}: no prefill leg of that "
                      "id on this instance (never registered, or from before a restart)"})

    def _done_sending(self, rid: str, nbytes: int, seconds: float) -> None:
        with self._lock:
            buf, held = self._buffers.pop(rid, None), self._held.pop(rid, None)
            deadline = buf.deadline if buf is not None else held[1] if held is not None \
                else None
            if deadline is None:
                return
            self._legs.pop(rid, None)
            self._forget(rid, "already read")
            self._sent.add(rid)
            st = self._send_stats
            st.send_bytes += nbytes
            st.send_time_s += seconds
            st.sends += 1  # the producer's queueing: the prefill's end -> the read served
            st.send_wait_s += time.monotonic() - (deadline - self.extra.abort_timeout_s)

    def _expire(self, rid: str) -> None:
        """Under the lock: a hold or buffer nobody read in time is gone (freed)."""
        self._legs.pop(rid, None)
        self._forget(rid, f"freed after abort_timeout_s ({self.extra.abort_timeout_s:g} s)")
        self._sent.add(rid)
        self._send_stats.expired_sends += 1

    def _forget(self, rid: str, why: str) -> None:
        """Under the lock: remember why a hold ended (the newest 4096)."""
        self._gone[rid] = why
        while len(self._gone) > 4096:
            self._gone.popitem(last=False)

    # ---- consumer ---------------------------------------------------------------------
    def _take_push(self, header: dict[str, Any], frames: list[memoryview]) -> None:
        """The server thread: a push from a trusted producer goes to the inbox; others are
        dropped (KV planted by anyone who can reach the side channel would otherwise wait
        there for the request it names)."""
        assert self._inbox is not None
        peer = header.get("peer_address")
        if not self.trust.allows_host(peer):
            with self._lock:
                if len(self._errors) < 1000:
                    self._errors.append(f"push from {peer} dropped: not a producer this "
                                        f"decode instance trusts ({self.trust.describe()})")
            return
        self._inbox.take(header, frames)

    def start_load_kv(self) -> None:
        meta = self._metadata
        if not isinstance(meta, P2pConnectorMetadata):
            return
        for load in meta.recv:
            self._reads[load.req_id] = self._reader.submit(self._read, load)

    def _read(self, load: RemoteLoad) -> tuple[int, float, bool]:
        """(bytes, seconds, served from a push) of one load, on a reader thread."""
        t0 = time.perf_counter()
        if not self.trust.allows(load.remote_host, load.remote_port):
            raise TransferError(f"remote_host {load.remote_host!r} (remote_port "
                                f"{load.remote_port}) is not a producer this decode instance "
                                f"trusts ({self.trust.describe()}): not contacted; list it in "
                                "kv_transfer_config kv_connector_extra_config "
                                "trusted_producers")
        if load.remote_prompt_digest not in (None, load.prompt_digest):
            raise TransferError(f"the handshake's prompt_digest "
                                f"({load.remote_prompt_digest[:16]}...) is not this request's "
                                f"prompt ({load.prompt_digest[:16]}...): the KV of "
                                f"{load.remote_request_id!r} is another prompt's; not read")
        header = {"op": "read" if load.local_block_ids else "release",
                  "engine_id": load.remote_engine_id, "namespace": self.namespace,
                  "request_id": load.remote_request_id, "block_ids": load.remote_block_ids,
                  "prompt_digest": load.prompt_digest}
        pushed = None
        if self._inbox is not None:
            if load.local_block_ids:
                pushed = self._inbox.wait_complete(load.remote_engine_id,
                                                   load.remote_request_id, load.pushed,
                                                   self.extra.push_wait_s, load.prompt_digest)
            else:
                self._inbox.discard(load.remote_engine_id, load.remote_request_id)
        if pushed is not None:  # the KV is here: copy it in, release the producer's buffer
            nbytes = self._copy_in(load.local_block_ids, pushed.layers,
                                   load.remote_block_ids)
            header["op"] = "release"
            try:
                self.transport.read(load.remote_host, load.remote_port, header,
                                    self.extra.load_timeout_s)
            except TransferError as e:  # its buffer expires there; nothing lost here
                self._log_error(f"release of {load.remote_request_id} after its push: {e}")
            return nbytes, time.perf_counter() - t0, True
        reply, frames = self.transport.read(load.remote_host, load.remote_port, header,
                                            self.extra.load_timeout_s)
        if not load.local_block_ids:
            return 0, time.perf_counter() - t0, False
        if reply.get("layout") != self.layout or len(frames) != len(self.caches):
            raise RuntimeError(f"the producer's KV layout {reply.get('layout')} differs from "
                               f"this instance's {self.layout}")
        n = len(load.local_block_ids)
        two, bs, hkv, d = self.layout["block_shape"]
        with warnings.catch_warnings():  # zmq frames are read-only; they are only copied
            warnings.simplefilter("ignore", UserWarning)
            raw = [f if isinstance(f, torch.Tensor) else torch.frombuffer(f, dtype=torch.uint8)
                   for f in frames]  # tensors: a transport that received on the device
            parts = [r.view(c.dtype).view(two, n, bs, hkv, d)
                     for c, r in zip(self.caches, raw, strict=True)]
            nbytes = self._copy_in(load.local_block_ids, parts)
        return nbytes, time.perf_counter() - t0, False

    def _copy_in(self, local_ids: list[int], layers: list[torch.Tensor],
                 places: list[int] | None = None) -> int:
        """Host blocks (`places` of each layer's tensor, or all of them) -> local blocks."""
        dev = self.caches[0].device
        index = torch.tensor(local_ids, dtype=torch.long, device=dev)
        pick = None if places is None else torch.tensor(places, dtype=torch.long)
        nbytes = 0
        for cache, part in zip(self.caches, layers, strict=True):
            if pick is not None:
                part = part.index_select(1, pick)
            cache.index_copy_(1, index, part.to(dev, non_blocking=False))
            nbytes += part.numel() * part.element_size()
        return nbytes

    def _log_error(self, message: str) -> None:
        with self._lock:
            self._errors.append(message)

    def save_kv_layer(self, layer: int, kv_layer: torch.Tensor) -> None:
        """Layerwise: called by the model right after `layer` has run. Copies this step's
        prompt blocks of every prefill leg to their send buffers on the copy thread (a CUDA
        stream on a GPU) while the later layers compute. Otherwise nothing: the decode
        instance reads the held blocks."""
        meta = self._metadata
        if not self.saves_layerwise or not isinstance(meta, P2pConnectorMetadata) \
                or not meta.stage:
            return
        cache = self.caches[layer]
        staged = [j for j in meta.stage if j.block_ids]
        jobs = [(self._buffers[j.req_id].layers[layer], j.first, j.block_ids) for j in staged]
        pushes = [j for j in staged if j.push_to is not None]
        if self._copy_stream is not None:  # after the layer's kernels, on the copy stream
            self._copy_stream.wait_stream(torch.cuda.current_stream(cache.device))
            with torch.cuda.stream(self._copy_stream):
                self._copies.append(_done(_copy_blocks(cache, jobs, non_blocking=True)))
                event = torch.cuda.Event() if pushes else None
                if event is not None:
                    event.record()
            if event is not None:  # the host buffer's slices once the copy has landed
                assert self._copier is not None
                self._copier.submit(self._push_layer, layer, pushes, event)
        else:
            assert self._copier is not None
            self._copies.append(self._copier.submit(self._stage_layer, layer, cache, jobs,
                                                    pushes))

    def _stage_layer(self, layer: int, cache: torch.Tensor,
                     jobs: list[tuple[torch.Tensor, int, list[int]]],
                     pushes: list[StageJob]) -> float:
        """The copy thread: one layer's staging copies, then its pushes."""
        seconds = _copy_blocks(cache, jobs)
        self._push_layer(layer, pushes)
        return seconds

    def _push_layer(self, layer: int, pushes: list[StageJob], event: Any = None) -> None:
        """The copy thread: this step's staged slices of `layer` to their decode instances."""
        if event is not None:
            event.synchronize()
        assert self._sender is not None
        for job in pushes:
            assert job.push_to is not None
            buf = self._buffers.get(job.req_id)
            if buf is not None:
                self._sender.push_slice(job.push_to, job.req_id, layer, job.first,
                                        buf.layers[layer], len(job.block_ids),
                                        job.prompt_digest)

    def wait_for_save(self) -> None:
        """Layerwise: every copy of this step done; legs whose prompt is complete become
        readable (until abort_timeout_s)."""
        meta = self._metadata
        if not self.saves_layerwise or not isinstance(meta, P2pConnectorMetadata) \
                or not meta.stage:
            return
        if self._copy_stream is not None:
            self._copy_stream.synchronize()
        seconds = sum(f.result() for f in self._copies)
        self._copies = []
        nbytes = sum(len(j.block_ids) for j in meta.stage) * self.bytes_per_block
        deadline = time.monotonic() + self.extra.abort_timeout_s
        with self._lock:
            self._send_stats.stage_bytes += nbytes
            self._send_stats.stage_time_s += seconds
            for job in meta.stage:
                if job.last and job.req_id in self._buffers:
                    self._buffers[job.req_id].deadline = deadline
        if self._sender is not None:  # after every slice (the copy thread keeps the order)
            assert self._copier is not None
            for job in meta.stage:
                if job.last and job.push_to is not None:
                    self._copier.submit(self._sender.push_done, job.push_to, job.req_id)

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
                nbytes, seconds, pushed = fut.result()
            except Exception as e:  # noqa: BLE001 - this request recomputes its prompt
                out.failed_recving.add(rid)
                out.stats.failed_loads += 1
                out.errors.append(f"read for {rid} failed: {type(e).__name__}: {e}")
                continue
            out.finished_recving.add(rid)
            out.recv_info[rid] = (nbytes, seconds)
            out.stats.recv_bytes += nbytes
            out.stats.recv_time_s += seconds
            out.stats.pushed_loads += pushed
        if self._sender is not None:
            out.stats.push_bytes, out.stats.push_time_s, out.stats.push_drops = \
                self._sender.counters()
        if self._inbox is not None:
            self._inbox.expire()
            out.stats.push_drops += self._inbox.take_dropped()
        now = time.monotonic()
        with self._lock:
            for rid, (_, deadline) in list(self._held.items()):
                if now >= deadline:  # nobody read them: free (vLLM's abort timeout)
                    del self._held[rid]
                    self._expire(rid)
                    self._errors.append(f"blocks held for {rid} were not read within "
                                        f"{self.extra.abort_timeout_s:g} s: freed")
            for rid, buf in list(self._buffers.items()):
                if buf.deadline is not None and now >= buf.deadline:
                    del self._buffers[rid]
                    self._expire(rid)
            out.finished_sending, self._sent = self._sent, set()
            out.stats.add(self._send_stats)
            self._send_stats = KVConnectorStats()
            out.errors.extend(self._errors)
            self._errors = []
        return out

    def shutdown(self) -> None:
        if self.role == KVConnectorRole.WORKER:
            self._reader.shutdown(wait=True)
            if self._copier is not None:
                if self._sender is not None:
                    self._copier.submit(self._sender.pusher.close)
                self._copier.shutdown(wait=True)
            self.transport.close()


def _copy_blocks(cache: torch.Tensor, jobs: list[tuple[torch.Tensor, int, list[int]]],
                 non_blocking: bool = False) -> float:
    """One layer's blocks into their send buffers; the seconds it took (host clock)."""
    t0 = time.perf_counter()
    with torch.inference_mode():  # the buffers are inference tensors (made in the step)
        for dst, first, ids in jobs:
            index = torch.tensor(ids, dtype=torch.long, device=cache.device)
            dst[:, first:first + len(ids)].copy_(cache.index_select(1, index),
                                                 non_blocking=non_blocking)
    return time.perf_counter() - t0


def _done(value: float) -> Future[float]:
    fut: Future[float] = Future()
    fut.set_result(value)
    return fut
