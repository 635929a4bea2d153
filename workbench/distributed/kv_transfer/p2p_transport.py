"""The P2pConnector's transport: one instance reads blocks of another's KV cache.

    server (producer's worker)                      client (consumer's worker)
    ROUTER tcp://host:port  <-- [header JSON] --     DEALER, one per read
                            -- [header JSON, layer 0 bytes, layer 1 bytes, ...] -->

Frames are a JSON header and raw tensor bytes (no pickle). The server answers from a
thread; a read for a request the producer has not registered yet (its scheduler announces
the blocks one step after the request finished, and the decode instance may be faster) is
parked and answered when the registration arrives, or refused after `park_timeout_s`.

Push (overlap on the wire): a producer may also send frames unasked, from its copy thread,
to a consumer's server: `[header JSON with "op": "push", payload frames]` on one DEALER per
destination (`Pusher`). The server hands them to `push_handler` with the sender's address
(`peer_address`, from the socket, overriding anything the header says) and answers nothing. A
destination that is not connected drops the push at once (ZMQ_IMMEDIATE); the consumer then
pulls as usual.

Dead peers fail fast: the client watches its socket's monitor, so a refused connection (the
producer is gone) or a disconnect before the answer ends the read at once, not after the
timeout; the consumer then recomputes the prompt.

`KVTransport` is the seam for other transports: `p2p_torch_transport.TorchDistTransport`
keeps this control path and moves the payload over torch.distributed (gloo, NCCL); NIXL (RDMA
reads of registered device memory) would implement the same two halves on GPUs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

logger = logging.getLogger(__name__)


class TransferError(RuntimeError):
    """A read that did not deliver the blocks (refused, peer gone, timed out)."""


@dataclass
class Reply:
    """The server's answer to one read: a header and the payload frames (bytes-like)."""

    header: dict[str, Any]
    frames: list[Any] = field(default_factory=list)
    on_sent: Callable[[], None] | None = None  # called once the frames are handed to zmq


# handler(header) -> the Reply, or None when the request is not registered yet (parked)
Handler = Callable[[dict[str, Any]], Reply | None]
# push_handler(header, payload frames): a push, answered with nothing
PushHandler = Callable[[dict[str, Any], list[memoryview]], None]


class KVTransport(ABC):
    # True: a Reply's payload frames may be tensors (on the KV cache's device) and `read`
    # returns flat uint8 tensors (on this instance's KV device or the host); False: both are
    # bytes-like
    tensor_frames: bool = False

    def register_kv_caches(self, kv_caches: list[Any]) -> None:  # noqa: B027 - optional
        """The local KV cache (before `start_server`): where a device transport receives or
        registers memory. Nothing here."""

    @abstractmethod
    def start_server(self, host: str, port: int, handler: Handler,
                     push_handler: PushHandler | None = None) -> int:
        """Serve reads (and take pushes) on host:port (0: a free port); returns the port."""

    @abstractmethod
    def pusher(self) -> Pusher:
        """A sender of pushes; used from one thread only."""

    @abstractmethod
    def read(self, host: str, port: int, header: dict[str, Any], timeout_s: float
             ) -> tuple[dict[str, Any], list[Any]]:
        """Send a request, wait for the answer (payload frames: memoryviews, or tensors
        when `tensor_frames`); raises TransferError."""

    @abstractmethod
    def close(self) -> None: ...


class ZmqTransport(KVTransport):
    def __init__(self, park_timeout_s: float = 30.0) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.park_timeout_s = park_timeout_s
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---------------------------------------------------------------- server
    def start_server(self, host: str, port: int, handler: Handler,
                     push_handler: PushHandler | None = None) -> int:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        if port == 0:
            port = sock.bind_to_random_port(f"tcp://{host}")
        else:
            sock.bind(f"tcp://{host}:{port}")
        self._thread = threading.Thread(target=self._serve, args=(sock, handler, push_handler),
                                        name="kv-p2p-server", daemon=True)
        self._thread.start()
        return port

    def _serve(self, sock: zmq.Socket, handler: Handler,
               push_handler: PushHandler | None) -> None:
        parked: list[tuple[bytes, dict[str, Any], float]] = []
        try:
            while not self._stop.is_set():
                timeout_ms = 5 if parked else 100
                if sock.poll(timeout_ms):
                    ident, raw, *payload = sock.recv_multipart(copy=False)
                    try:
                        header = json.loads(raw.bytes)
                        if not isinstance(header, dict):
                            raise ValueError("the header is not an object")
                    except ValueError as e:
                        self._send(sock, ident.bytes, Reply({"ok": False,
                                                             "error": f"bad request: {e}"}))
                        continue
                    if header.get("op") == "push":  # unasked: taken, never answered
                        # where it came from, as the socket saw it (not as the sender says)
                        header["peer_address"] = _peer_address(raw)
                        if push_handler is not None:
                            try:
                                push_handler(header, [f.buffer for f in payload])
                            except Exception:  # noqa: BLE001 - a bad push fails alone
                                logger.exception("KV push dropped")
                        continue
                    parked.append((ident.bytes, header, time.monotonic()))
                if parked:  # new requests and parked ones (retried every 5 ms)
                    parked = self._answer(sock, handler, parked)
        finally:
            sock.close(0)

    def _answer(self, sock: zmq.Socket, handler: Handler,
                parked: list[tuple[bytes, dict[str, Any], float]]
                ) -> list[tuple[bytes, dict[str, Any], float]]:
        still = []
        now = time.monotonic()
        for ident, header, since in parked:
            try:
                reply = handler(header)
            except Exception as e:  # noqa: BLE001 - one bad read fails alone
                reply = Reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
            if reply is None:
                if now - since < self.park_timeout_s:
                    still.append((ident, header, since))
                    continue
                reply = Reply({"ok": False, "error": "unknown request "
                               f"{header.get('request_id')!r} (expired, already read, or "
                               "never registered)"})
            self._send(sock, ident, reply)
        return still

    @staticmethod
    def _send(sock: zmq.Socket, ident: bytes, reply: Reply) -> None:
        sock.send_multipart([ident, json.dumps(reply.header).encode(), *reply.frames],
                            copy=False)
        if reply.on_sent is not None:
            reply.on_sent()

    # ---------------------------------------------------------------- client
    def read(self, host: str, port: int, header: dict[str, Any], timeout_s: float
             ) -> tuple[dict[str, Any], list[memoryview]]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
                                          | zmq.EVENT_CLOSED)
        try:
            sock.connect(f"tcp://{host}:{port}")
            sock.send(json.dumps(header).encode())
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferError(f"no answer from {host}:{port} within {timeout_s:g} s")
                events = dict(poller.poll(int(left * 1000) + 1))
                if sock in events:
                    frames = sock.recv_multipart(copy=False)
                    reply = json.loads(frames[0].bytes)
                    if not reply.get("ok"):
                        raise TransferError(f"{host}:{port} refused the read: "
                                            f"{reply.get('error')}")
                    return reply, [f.buffer for f in frames[1:]]
                if monitor in events:
                    event = recv_monitor_message(monitor)["event"]
                    if event == zmq.EVENT_CONNECT_RETRIED:
                        raise TransferError(f"{host}:{port} refused the connection (the "
                                            "producer is gone)")
                    if event == zmq.EVENT_DISCONNECTED:
                        raise TransferError(f"{host}:{port} disconnected before answering")
        finally:
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)

    def pusher(self) -> ZmqPusher:
        return ZmqPusher(self.ctx)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def _peer_address(frame: zmq.Frame) -> str | None:
    """The sending peer's IP address (ZeroMQ's "Peer-Address" frame property), or None."""
    try:
        return str(frame.get("Peer-Address"))
    except (zmq.ZMQError, AttributeError, UnicodeDecodeError):
        return None


class Pusher(ABC):
    @abstractmethod
    def push(self, host: str, port: int, header: dict[str, Any], frames: list[Any]) -> bool:
        """Send `frames` to host:port without waiting; False: not connected (dropped)."""

    @abstractmethod
    def close(self) -> None: ...


class ZmqPusher(Pusher):
    """One DEALER per destination, connected on first use. ZMQ_IMMEDIATE: nothing is queued
    for a destination that is not connected (the push is dropped, the consumer pulls)."""

    def __init__(self, ctx: zmq.Context, connect_wait_s: float = 0.5) -> None:
        self.ctx = ctx
        self.connect_wait_s = connect_wait_s
        self._socks: dict[tuple[str, int], zmq.Socket] = {}

    def push(self, host: str, port: int, header: dict[str, Any], frames: list[Any]) -> bool:
        sock = self._socks.get((host, port))
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.SNDHWM, 10_000)
            sock.connect(f"tcp://{host}:{port}")
            self._socks[(host, port)] = sock
            # the first push waits for the connection (a live peer connects in ~1 ms)
            if not sock.poll(int(self.connect_wait_s * 1000), zmq.POLLOUT):
                return False
        try:
            sock.send_multipart([json.dumps(header).encode(), *frames], flags=zmq.NOBLOCK,
                                copy=False)
        except zmq.Again:
            return False
        return True

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(0)
        self._socks = {}
