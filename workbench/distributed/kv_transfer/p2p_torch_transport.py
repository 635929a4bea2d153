"""The P2pConnector's torch.distributed transport: control over ZeroMQ, the KV over a
two-rank process group per consumer-producer pair (`p2p_torch_group`: gloo for CPU caches,
NCCL for CUDA ones, or gloo through host memory on request).

    consumer (rank 0, hosts the store)                   producer (rank 1)
    first contact:  TCPStore on its side-channel host
                    -- ZMQ {"op": "torch_dist_connect", store, backend} -->  a join thread
                    ProcessGroupGloo / ProcessGroupNCCL(store, 0, 2)  ==  (store, 1, 2)
    each read:      -- ZMQ [read header + peer, epoch] -->
                                                   (gloo: recv "ready" posted)
                    <-- ZMQ [reply header + "torch_dist_nbytes", "torch_dist_tag"] --
                    recv(one flat uint8 tensor per layer), gloo: send "ready" -->
                    <== send(index_select of the blocks), on the pair's sender thread

The control messages are `ZmqTransport`'s (this class wraps one: parking, dead-peer
detection and the push path are its); only the payload moves. The group is made on the
consumer's first read from a producer and cached per producer; the consumer serialises its
reads per producer (NCCL matches sends and recvs in order, not by tag). On gloo the producer
sends once the consumer's receives are posted (its "ready"): a gloo send that lands before
its receive is posted completes ~8 ms later on this machine, one posted first in ~0.2 ms.
Any failure on a group (the peer gone: gloo sees the closed connection at once; a timeout)
fails that read with a `TransferError`, so the request recomputes, and drops the group; the
next read reconnects. Frames are tensors, never pickle; a reader without a group (a plain
`zmq` consumer) gets the same payload as bytes on the ZeroMQ reply. Push is not carried
here: `pusher()` is the ZeroMQ one (pushed slices are host tensors either way).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workbench.distributed.kv_transfer.p2p_torch_group import (
    CONSUMER,
    PRODUCER,
    PairGroup,
    Peer,
    backend_for,
    flat_bytes,
    host_bytes,
    master_store,
    new_process_group,
)
from workbench.distributed.kv_transfer.p2p_transport import (
    Handler,
    KVTransport,
    PushHandler,
    Reply,
    TransferError,
    ZmqPusher,
    ZmqTransport,
)

logger = logging.getLogger(__name__)

CONNECT = "torch_dist_connect"


class TorchDistTransport(KVTransport):
    tensor_frames = True

    def __init__(self, park_timeout_s: float = 30.0, backend: str = "auto") -> None:
        self._zmq = ZmqTransport(park_timeout_s=park_timeout_s)
        self.park_timeout_s = park_timeout_s
        self.requested_backend = backend
        self.uid = uuid.uuid4().hex[:16]
        self.host = "127.0.0.1"  # where this side's store and gloo sockets listen
        self.device = torch.device("cpu")  # the KV cache's
        self.backend = "gloo"
        self.wire = self.device  # where payload tensors are sent from and received into
        self._lock = threading.Lock()
        self._groups: dict[str, PairGroup] = {}  # producer: consumer uid -> its group
        self._peers: dict[tuple[str, int], Peer] = {}  # consumer: producer -> its group
        self._epochs = itertools.count(1)
        self.sent_bytes = 0  # payload bytes handed to torch.distributed (producer)
        self.received_bytes = 0  # payload bytes received over it (consumer)

    def register_kv_caches(self, kv_caches: list[Any]) -> None:
        self.device = kv_caches[0].device
        self.backend = backend_for(self.device, self.requested_backend)
        self.wire = self.device if self.backend == "nccl" else torch.device("cpu")

    # ---------------------------------------------------------------- server (producer)
    def start_server(self, host: str, port: int, handler: Handler,
                     push_handler: PushHandler | None = None) -> int:
        self.host = host
        return self._zmq.start_server(host, port, self._wrap(handler), push_handler)

    def _wrap(self, handler: Handler) -> Handler:
        def handle(header: dict[str, Any]) -> Reply | None:
            if header.get("op") == CONNECT:
                return self._accept(header)
            uid = header.get("torch_dist_peer")
            group = None
            if uid is not None:
                with self._lock:
                    group = self._groups.get(str(uid))
                if group is None or group.epoch != header.get("torch_dist_epoch"):
                    return Reply({"ok": False, "error": f"torch_dist peer {uid} is not "
                                  "connected here (restarted, or dropped after an error)"})
                if group.error is not None:
                    return Reply({"ok": False, "error": f"torch_dist group with {uid} "
                                  f"failed to form: {group.error}"})
                if group.pg is None:
                    return None  # still joining: parked, answered once it has
            reply = handler(header)
            if reply is None or not reply.frames:
                return reply
            if group is None:  # a zmq reader: the payload as bytes on the reply
                return Reply(reply.header, [host_bytes(f) for f in reply.frames],
                             reply.on_sent)
            frames, on_sent, tag = reply.frames, reply.on_sent, next(group.tags)
            sizes = [int(f.nbytes) for f in frames]
            ready = None
            if group.backend == "gloo":  # posted before the header goes out
                try:
                    ready = group.pg.recv([torch.empty(1, dtype=torch.uint8)], CONSUMER, tag)
                except Exception as e:  # noqa: BLE001 - a broken group: refuse, reconnect
                    self._drop(group, f"{type(e).__name__}: {e}")
                    return Reply({"ok": False, "error": f"torch_dist group with {uid} "
                                  f"broke: {e}"})

            def sent() -> None:  # the header is on the wire: the payload follows
                try:
                    group.sender.submit(self._send, group, frames, tag, ready)
                except RuntimeError:  # dropped meanwhile: that reader fails and recomputes
                    pass
                if on_sent is not None:
                    on_sent()

            return Reply({**reply.header, "torch_dist_nbytes": sizes,
                          "torch_dist_tag": tag}, [], sent)

        return handle

    def _accept(self, header: dict[str, Any]) -> Reply:
        uid, epoch = header.get("torch_dist_peer"), header.get("torch_dist_epoch")
        store_host, store_port = header.get("store_host"), header.get("store_port")
        if not (isinstance(uid, str) and isinstance(epoch, int) and isinstance(store_host, str)
                and isinstance(store_port, int)):
            return Reply({"ok": False, "error": f"bad {CONNECT} request"})
        if header.get("backend") != self.backend:
            return Reply({"ok": False, "error": f"backend {header.get('backend')!r} differs "
                          f"from this instance's ({self.backend}: KV cache on "
                          f"{self.device.type})"})
        group = PairGroup(uid, epoch, self.backend)
        with self._lock:
            old, self._groups[uid] = self._groups.get(uid), group
        if old is not None:
            old.close()
        threading.Thread(target=self._join, args=(group, store_host, store_port),
                         name="kv-torch-join", daemon=True).start()
        return Reply({"ok": True})

    def _join(self, group: PairGroup, store_host: str, store_port: int) -> None:
        try:
            store = dist.TCPStore(store_host, store_port, 2, False,
                                  timedelta(seconds=self.park_timeout_s))
            pg = new_process_group(self.backend, store, PRODUCER, self.park_timeout_s, self.host,
                            self.device)
        except Exception as e:  # noqa: BLE001 - reads on this group are refused, naming it
            group.error = f"{type(e).__name__}: {e}"
            logger.warning("torch_dist group with %s failed to form: %s", group.peer, e)
            return
        group.store, group.pg = store, pg
        with self._lock:
            current = self._groups.get(group.peer) is group
        if not current:  # replaced by a reconnect meanwhile
            group.close()

    def _send(self, group: PairGroup, frames: list[torch.Tensor], tag: int,
              ready: Any = None) -> None:
        """The group's sender thread, after the reply header went out: wait for the
        consumer's "ready" (gloo: its receives are posted; a send that arrives before its
        receive costs gloo ~8 ms more), post the sends, keep them (and their tensors) until
        they are done."""
        try:
            deadline = time.monotonic() + self.park_timeout_s
            if ready is not None:
                self._wait(ready, deadline)
            pg = group.pg
            if pg is None:
                raise RuntimeError("the group was dropped")
            flat = [flat_bytes(f).to(self.wire) for f in frames]
            works = [pg.send([t], CONSUMER, tag) for t in flat if t.numel()]
            with self._lock:
                self.sent_bytes += sum(t.numel() for t in flat)
            for work in works:
                self._wait(work, deadline)
        except Exception as e:  # noqa: BLE001 - that reader recomputes; drop the group
            self._drop(group, f"send failed: {type(e).__name__}: {e}")

    def _drop(self, group: PairGroup, why: str) -> None:
        logger.warning("torch_dist group with %s dropped: %s", group.peer, why)
        with self._lock:
            if self._groups.get(group.peer) is group:
                del self._groups[group.peer]
        group.close()

    # ---------------------------------------------------------------- client (consumer)
    def read(self, host: str, port: int, header: dict[str, Any], timeout_s: float
             ) -> tuple[dict[str, Any], list[Any]]:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            peer = self._peers.setdefault((host, port), Peer())
        with peer.lock:
            try:
                if peer.group is None:
                    peer.group = self._connect(host, port, timeout_s)
                group = peer.group
                reply, frames = self._zmq.read(host, port, {
                    **header, "torch_dist_peer": self.uid, "torch_dist_epoch": group.epoch},
                    max(deadline - time.monotonic(), 1e-3))
                sizes = reply.pop("torch_dist_nbytes", None)
                tag = reply.pop("torch_dist_tag", None)
                if sizes is None:
                    return reply, frames
                return reply, self._receive(group, sizes, tag, deadline)
            except Exception as e:
                if peer.group is not None:  # it may be out of step: the next read reconnects
                    peer.group.close()
                    peer.group = None
                if isinstance(e, TransferError):
                    raise
                raise TransferError(f"torch_dist receive from {host}:{port} failed (the "
                                    f"producer is gone?): {type(e).__name__}: {e}") from e

    def _connect(self, host: str, port: int, timeout_s: float) -> PairGroup:
        """First contact: a store here, the producer joins it, both make the group."""
        store, store_port = master_store(self.host, timeout_s)
        group = PairGroup(host, next(self._epochs), self.backend, store)
        try:
            self._zmq.read(host, port, {"op": CONNECT, "torch_dist_peer": self.uid,
                                        "torch_dist_epoch": group.epoch,
                                        "store_host": self.host, "store_port": store_port,
                                        "backend": self.backend}, timeout_s)
        except TransferError as e:
            hint = " (is its transport torch_dist?)" if "refused the read" in str(e) else ""
            raise TransferError(f"torch_dist rendezvous with {host}:{port} failed{hint}: "
                                f"{e}") from e
        group.pg = new_process_group(self.backend, store, CONSUMER, timeout_s, self.host,
                                     self.device)
        return group

    def _receive(self, group: PairGroup, sizes: list[int], tag: int, deadline: float
                 ) -> list[torch.Tensor]:
        out = [torch.empty(int(n), dtype=torch.uint8, device=self.wire) for n in sizes]
        works = [group.pg.recv([t], PRODUCER, tag) for t in out if t.numel()]
        if group.backend == "gloo":  # the receives are posted: the producer may send
            works.append(group.pg.send([torch.ones(1, dtype=torch.uint8)], PRODUCER, tag))
        for work in works:
            self._wait(work, deadline)
        with self._lock:
            self.received_bytes += sum(int(n) for n in sizes)
        return out

    def _wait(self, work: Any, deadline: float) -> None:
        left = deadline - time.monotonic()
        if self.backend == "gloo":  # blocks in C++; a closed peer connection raises at once
            work.wait(timedelta(seconds=max(left, 1e-3)))
            return
        while not work.is_completed():  # NCCL: never block the host past the deadline
            if time.monotonic() >= deadline:
                raise TransferError("the NCCL transfer did not complete in time")
            time.sleep(2e-4)
        work.wait()  # raises the communicator's error, if any

    # ---------------------------------------------------------------- both
    def pusher(self) -> ZmqPusher:
        return self._zmq.pusher()  # pushes travel over ZeroMQ

    def close(self) -> None:
        self._zmq.close()
        with self._lock:
            groups = list(self._groups.values())
            groups += [p.group for p in self._peers.values() if p.group is not None]
            self._groups, self._peers = {}, {}
        for group in groups:
            group.close()
