"""PushInbox, the consumer's side of the push: a decode read whose producer said it pushed
here (`pushed_to` in the handshake) waits for the pushes still on the wire, and stops waiting
the moment the outcome is known (complete, refused, or "done" with nothing of it arrived).
No wall-clock figure is checked: waits are bounded by a long timeout that must not be hit."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from workbench.distributed.kv_transfer.p2p_push import PushInbox

LAYOUT = {"num_layers": 2, "block_shape": [2, 4, 1, 2]}  # [K/V, block_size, Hkv, D]
LONG = 60.0  # a wait that reaching would fail the test (the outcome arrives long before)
DIGEST = "a" * 64  # the pushed prompt's digest (p2p_trust.prompt_digest)


def inbox(capacity: int = 1 << 20) -> PushInbox:
    return PushInbox(LAYOUT, torch.float32, capacity, expiry_s=3600.0)


def slice_msg(layer: int, first: int, n: int, fill: float, rid: str = "r1"
              ) -> tuple[dict[str, Any], list[memoryview]]:
    half = torch.full((n, 4, 1, 2), fill, dtype=torch.float32)
    header = {"op": "push", "engine_id": "P", "request_id": rid, "layer": layer,
              "first": first, "n": n, "num_blocks": 2, "layout": LAYOUT,
              "prompt_digest": DIGEST}
    return header, [memoryview(half.numpy().tobytes()), memoryview((-half).numpy().tobytes())]


def done_msg(count: int, ok: bool = True, rid: str = "r1") -> dict[str, Any]:
    return {"op": "push", "kind": "done", "engine_id": "P", "request_id": rid,
            "num_pushes": count, "ok": ok}


def read_in_thread(box: PushInbox, expected: bool, rid: str = "r1") -> tuple[threading.Thread,
                                                                              list[Any]]:
    got: list[Any] = []

    def run() -> None:
        t0 = time.monotonic()
        got.append(box.wait_complete("P", rid, expected, LONG, DIGEST))
        got.append(time.monotonic() - t0)

    t = threading.Thread(target=run)
    t.start()
    return t, got


def waiting(box: PushInbox) -> None:
    """Until the reader thread is inside the condition's wait (it released the lock)."""
    while True:
        with box._cond:
            if box._cond._waiters:  # type: ignore[attr-defined]
                return
        time.sleep(0.001)


def test_a_read_that_comes_before_its_pushes_waits_for_them() -> None:
    box = inbox()
    t, got = read_in_thread(box, expected=True)
    waiting(box)  # nothing has arrived yet: the read waits instead of pulling
    for layer in range(2):
        box.take(*slice_msg(layer, 0, 2, float(layer + 1)))
    assert t.is_alive()  # slices in, "done" not yet
    box.take(done_msg(2), [])
    t.join(LONG)
    entry = got[0]
    assert entry is not None and entry.done and not entry.failed and entry.received == 2
    assert got[1] < LONG
    assert entry.layers[1][0].eq(2.0).all() and entry.layers[1][1].eq(-2.0).all()
    assert box.used == 0 and not box._entries


def test_a_read_not_told_of_a_push_does_not_wait() -> None:
    box = inbox()
    assert box.wait_complete("P", "r1", False, LONG, DIGEST) is None


def test_done_with_nothing_arrived_ends_the_wait_and_the_read_pulls() -> None:
    box = inbox()
    t, got = read_in_thread(box, expected=True)
    waiting(box)
    box.take(done_msg(0, ok=False), [])  # the producer's slices were all dropped
    t.join(LONG)
    assert got[0] is None and got[1] < LONG
    assert list(box._refused) == [("P", "r1")]  # kept until it expires, past the read


def test_a_push_refused_for_room_ends_the_wait() -> None:
    box = inbox(capacity=1)
    t, got = read_in_thread(box, expected=True)
    waiting(box)
    box.take(*slice_msg(0, 0, 2, 1.0))  # no room: refused, counted, the read pulls
    t.join(LONG)
    assert got[0] is None
    box.take(*slice_msg(1, 0, 2, 1.0))  # a slice still on the wire after the read: no 2nd drop
    box.take(done_msg(2), [])  # the producer's "done" after: still nothing kept
    assert box.take_dropped() == 1  # one prefill refused, however many of its slices land
    assert not box._entries and box.used == 0


def test_a_refused_prefill_is_forgotten_when_it_expires() -> None:
    box = PushInbox(LAYOUT, torch.float32, 1, expiry_s=5.0)
    box.take(*slice_msg(0, 0, 2, 1.0))
    assert box.take_dropped() == 1 and list(box._refused) == [("P", "r1")]
    box._expire(time.monotonic() + 5.0)  # an injected "later" (no waiting)
    assert not box._refused


def test_a_lost_slice_fails_the_entry() -> None:
    box = inbox()
    box.take(*slice_msg(0, 0, 2, 1.0))
    box.take(done_msg(2), [])  # two sent, one arrived
    assert box.wait_complete("P", "r1", True, LONG, DIGEST) is None
    assert box.used == 0


def test_discarded_before_its_slices_land_keeps_nothing() -> None:
    box = inbox()
    box.discard("P", "r1")  # the decode side had the prompt cached
    box.take(*slice_msg(0, 0, 2, 1.0))
    box.take(done_msg(1), [])
    assert not box._entries and box.used == 0 and box.take_dropped() == 0


def test_another_prompts_push_is_not_taken_and_stays_for_its_own_read() -> None:
    """A decode request naming another request's pushed prefill (its prompt differs) gets
    nothing, at once; the entry stays for the request whose prompt it is."""
    box = inbox()
    for layer in range(2):
        box.take(*slice_msg(layer, 0, 2, 1.0))
    box.take(done_msg(2), [])
    assert box.wait_complete("P", "r1", True, LONG, "b" * 64) is None
    entry = box.wait_complete("P", "r1", True, LONG, DIGEST)
    assert entry is not None and entry.done and not entry.failed
    assert box.used == 0
