"""P2pConnector push: a prefill leg's KV sent to the decode instance while prefill runs.

The pull (`p2p_connector`) moves the whole prompt's KV after the prefill leg has finished,
on the decode request's critical path. With push, the proxy picks the decode instance
first and names its side channel in the prefill request (`kv_transfer_params`
`remote_host`/`remote_port` beside `do_remote_decode`); the producer, staging layer by
layer (`layerwise`), also sends each staged slice there from its copy thread:

    producer copy thread                          consumer server thread
    after layer i of a step: [push header, K bytes, V bytes]  ->  PushInbox.take_slice
    after the leg's last step: [push header kind "done", count] -> the entry is complete

When the decode request arrives with the usual handshake, the consumer's read finds the
complete entry in its inbox (keyed by the producer's engine_id and request id; taken only
when the pushed prompt's digest is the decode request's own, `p2p_trust`), copies it
into its blocks and only tells the producer to release its send buffer. Anything short of a
complete entry — a push dropped (decode side not connected, inbox full), the entry expired,
a different layout — and the read pulls from the producer as without push. Tokens are the
same either way.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from workbench.distributed.kv_transfer.p2p_transport import Pusher

logger = logging.getLogger(__name__)


@dataclass
class _Entry:
    """One pushed prefill on the consumer: [2, num_blocks, block_size, Hkv, D] per layer."""

    layers: list[torch.Tensor]
    nbytes: int
    deadline: float
    prompt_digest: str  # the pushed prompt's (the producer's header)
    received: int = 0  # slices taken
    done: bool = False  # the producer's "done" arrived and every slice with it
    failed: bool = False  # a slice was dropped on the way: pull instead


class PushInbox:
    """Consumer side: KV pushed by producers, until a decode request takes it (or it
    expires after `expiry_s`). At most `capacity_bytes` are kept; pushes beyond are
    dropped (those requests pull)."""

    def __init__(self, layout: dict[str, Any], dtype: torch.dtype, capacity_bytes: int,
                 expiry_s: float) -> None:
        self.layout = layout
        self.dtype = dtype
        self.capacity_bytes = capacity_bytes
        self.expiry_s = expiry_s
        self.used = 0
        self._entries: dict[tuple[str, str], _Entry] = {}
        # prefills refused here -> when to forget them, oldest first; kept past the read,
        # because slices still on the wire after it must not open an entry (and count a
        # second drop)
        self._refused: dict[tuple[str, str], float] = {}
        self._cond = threading.Condition()
        self.dropped = 0  # prefills whose push was refused here (no room, other layout)

    def take(self, header: dict[str, Any], frames: list[memoryview]) -> None:
        """The server thread: one push message."""
        key = (str(header.get("engine_id")), str(header.get("request_id")))
        with self._cond:
            self._expire(time.monotonic())
            if key in self._refused:  # kept until it expires (or the cap clears it)
                return
            entry = self._entries.get(key)
            if header.get("kind") == "done":
                if entry is None:  # nothing of it arrived: a waiting read pulls now
                    self._remember_refused(key)
                else:
                    entry.done = True
                    entry.failed = entry.failed or not header.get("ok") \
                        or header.get("num_pushes") != entry.received
                self._cond.notify_all()
                return
            if entry is None:
                entry = self._open(key, header)
                if entry is None:
                    return
            self._copy_in(entry, header, frames)

    def _open(self, key: tuple[str, str], header: dict[str, Any]) -> _Entry | None:
        if header.get("layout") != self.layout:
            logger.warning("KV push for %s refused: the producer's layout %s differs from "
                           "this instance's %s", key[1], header.get("layout"), self.layout)
            self._refuse(key)
            return None
        two, bs, hkv, d = self.layout["block_shape"]
        n = int(header["num_blocks"])
        shape = (two, n, bs, hkv, d)
        nbytes = self.layout["num_layers"] * two * n * bs * hkv * d * self.dtype.itemsize
        if self.used + nbytes > self.capacity_bytes:
            self._refuse(key)
            return None
        entry = _Entry([torch.empty(shape, dtype=self.dtype)
                        for _ in range(self.layout["num_layers"])], nbytes,
                       time.monotonic() + self.expiry_s, str(header.get("prompt_digest")))
        self.used += nbytes
        self._entries[key] = entry
        return entry

    def _remember_refused(self, key: tuple[str, str]) -> None:
        self._refused.pop(key, None)  # re-inserted at the end: the dict stays in expiry order
        self._refused[key] = time.monotonic() + self.expiry_s

    def _refuse(self, key: tuple[str, str]) -> None:
        self._remember_refused(key)
        self.dropped += 1
        self._cond.notify_all()

    @staticmethod
    def _copy_in(entry: _Entry, header: dict[str, Any], frames: list[memoryview]) -> None:
        layer = entry.layers[int(header["layer"])]
        first, n = int(header["first"]), int(header["n"])
        with warnings.catch_warnings():  # zmq frames are read-only; they are only copied
            warnings.simplefilter("ignore", UserWarning)
            for half, frame in enumerate(frames):  # K, then V: [n, block_size, Hkv, D]
                dst = layer[half, first:first + n]
                raw = torch.frombuffer(frame, dtype=torch.uint8).view(layer.dtype)
                dst.copy_(raw.view(dst.shape))
        entry.received += 1

    def wait_complete(self, engine_id: str, request_id: str, expected: bool,
                      wait_s: float, prompt_digest: str) -> _Entry | None:
        """A reader thread: the complete entry of that prefill, taken out of the inbox;
        None when there is none (never pushed, dropped, expired, not complete within
        `wait_s`) or it is another prompt's (left for its own request). `expected`: the
        producer said it pushed here, so wait for the first slice to land too (it may still
        be on the wire when the decode request comes)."""
        key = (engine_id, request_id)

        def settled() -> bool:
            entry = self._entries.get(key)
            if entry is not None and entry.prompt_digest != prompt_digest:
                return True
            return key in self._refused or (entry.done if entry is not None else not expected)

        with self._cond:
            self._cond.wait_for(settled, timeout=wait_s)
            entry = self._entries.get(key)
            if entry is not None and entry.prompt_digest != prompt_digest:
                return None
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.used -= entry.nbytes
            return entry if entry.done and not entry.failed else None

    def take_dropped(self) -> int:
        """Pushes refused here since the last call."""
        with self._cond:
            out, self.dropped = self.dropped, 0
        return out

    def discard(self, engine_id: str, request_id: str) -> None:
        """The decode instance needs none of it (its prefix cache had the prompt); slices
        still on the way are ignored when they land."""
        key = (engine_id, request_id)
        with self._cond:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.used -= entry.nbytes
            if entry is None or not entry.done:
                self._remember_refused(key)

    def expire(self) -> None:
        with self._cond:
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        for key, entry in list(self._entries.items()):
            if now >= entry.deadline:
                del self._entries[key]
                self.used -= entry.nbytes
        while self._refused:  # oldest first: stop at the first one still to keep
            key, until = next(iter(self._refused.items()))
            if now < until:
                break
            del self._refused[key]
        if len(self._refused) > 4096:
            self._refused.clear()


class PushSender:
    """Producer side, on the copy thread only: a leg's staged slices to its decode
    instance, then "done" with the count (the consumer checks nothing was lost)."""

    def __init__(self, pusher: Pusher, engine_id: str, layout: dict[str, Any]) -> None:
        self.pusher = pusher
        self.engine_id = engine_id
        self.layout = layout
        self._sent: dict[str, list[int]] = {}  # request -> [pushes sent, any dropped]
        self._lock = threading.Lock()
        self._counts = [0, 0.0, 0]  # bytes, seconds, drops since the last `counters()`

    def counters(self) -> tuple[int, float, int]:
        """(bytes pushed, seconds in push calls, legs dropped) since the last call."""
        with self._lock:
            out, self._counts = self._counts, [0, 0.0, 0]
        return int(out[0]), float(out[1]), int(out[2])

    def _add(self, nbytes: int, seconds: float, drops: int) -> None:
        with self._lock:
            self._counts[0] += nbytes
            self._counts[1] += seconds
            self._counts[2] += drops

    def push_slice(self, dest: tuple[str, int], rid: str, layer: int, first: int,
                   buffer: torch.Tensor, num_blocks: int, prompt_digest: str = "") -> None:
        """`buffer`: the leg's host send buffer of `layer`; blocks first.. just staged."""
        state = self._sent.setdefault(rid, [0, 0])
        if state[1]:
            return  # one drop: the consumer pulls this leg, no point sending more
        n = num_blocks
        t0 = time.perf_counter()
        frames = [buffer[half, first:first + n].view(torch.uint8).numpy().reshape(-1)
                  for half in range(buffer.shape[0])]
        header = {"op": "push", "engine_id": self.engine_id, "request_id": rid,
                  "layer": layer, "first": first, "n": n, "num_blocks": buffer.shape[1],
                  "layout": self.layout, "prompt_digest": prompt_digest}
        ok = self.pusher.push(dest[0], dest[1], header, frames)
        state[0] += ok
        state[1] = int(not ok)
        self._add(sum(f.nbytes for f in frames) if ok else 0, time.perf_counter() - t0,
                  int(not ok))

    def push_done(self, dest: tuple[str, int], rid: str) -> None:
        count, dropped = self._sent.pop(rid, [0, 0])
        self.pusher.push(dest[0], dest[1], {"op": "push", "kind": "done",
                                            "engine_id": self.engine_id, "request_id": rid,
                                            "num_pushes": count, "ok": not dropped}, [])

    def forget(self, rid: str) -> None:
        self._sent.pop(rid, None)
