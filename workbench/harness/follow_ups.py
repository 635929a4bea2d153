"""Follow-ups: the runner's dispatch for workloads whose requests depend on each other.

Place in the flow: `runner._Driver` hands a workload with `follows` (multi_turn_chat's later
turns, or a JSONL's) to `FollowUpDispatch`; the first turns come with the arrival process's
offsets, and the dispatch decides when every request is sent:

    due_s(first turn)  = its arrival offset (0 in a closed loop)
    due_s(follow-up)   = the finish of the request it follows + think_s   (runner's clock)
    send               = due requests in (due_s, workload order), while fewer than `cap`
                         are in flight (closed loop: concurrency; open: max_concurrency/None)

A failed predecessor releases its follow-ups like a successful one (a failed turn never blocks
its session); each follow-up's row in `follow_ups` says whether it did. A cancelled one
(max_duration_s, stop) releases nothing: the run is ending. Time is only read through `now_s`
and waited through `sleep`, so a test with a virtual clock gets exact send times.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from workbench.harness.workload_base import BenchRequest, Workload

if TYPE_CHECKING:
    from workbench.harness.metrics import RequestRecord


def follow_ups_of(workload: Workload) -> dict[str, list[BenchRequest]]:
    """Request id -> the requests that follow it, in workload order ({} when no request
    follows another); ValueError unless each `follows` names an earlier request and the
    request ids are unique."""
    if all(r.follows is None for r in workload.requests):
        return {}
    children: dict[str, list[BenchRequest]] = {}
    for r in workload.requests:
        if r.request_id in children:
            raise ValueError(f"workload {workload.name!r}: request_id {r.request_id!r} is a "
                             "duplicate; follow-ups need unique ids")
        if r.follows is not None:
            if r.follows not in children:
                raise ValueError(
                    f"workload {workload.name!r}: request {r.request_id!r} follows "
                    f"{r.follows!r}, which is not an earlier request; list a request before "
                    "the requests that follow it")
            children[r.follows].append(r)
        children[r.request_id] = []
    return children


class FollowUpDispatch:
    """Sends `requests` (with follow-ups) when due, at most `cap` in flight; see the module
    docstring. `send(req, target_arrival_s)` sends one request and returns its record;
    `spawn(coro)` starts a task the runner can cancel."""

    def __init__(
        self,
        requests: list[BenchRequest],
        children: dict[str, list[BenchRequest]],
        firsts: list[BenchRequest],
        offsets: list[float] | None,
        *,
        cap: int | None,
        now_s: Callable[[], float],
        sleep: Callable[[float], Awaitable[Any]],
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        send: Callable[[BenchRequest, float | None], Awaitable[RequestRecord]],
    ) -> None:
        self.total, self.children, self.cap = len(requests), children, cap
        self.now_s, self.sleep, self.spawn, self.send = now_s, sleep, spawn, send
        self.order = {r.request_id: i for i, r in enumerate(requests)}
        self.due: list[tuple[float, int, BenchRequest, float | None]] = []  # a heap
        for i, r in enumerate(firsts):
            off = offsets[i] if offsets is not None else None
            self._push(0.0 if off is None else off, r, off)
        # one row per follow-up released: request_id, follows, follows_success, due_s, sent_s
        self.follow_ups: list[dict[str, Any]] = []
        self._rows: dict[str, dict[str, Any]] = {}
        self.in_flight = self.sent = 0
        self.tasks: list[asyncio.Task[Any]] = []
        self.changed = asyncio.Event()

    def _push(self, due_s: float, req: BenchRequest, target_arrival_s: float | None) -> None:
        heapq.heappush(self.due, (due_s, self.order[req.request_id], req, target_arrival_s))

    async def _one(self, req: BenchRequest, target_arrival_s: float | None) -> None:
        rec = await self.send(req, target_arrival_s)  # a cancellation propagates: no release
        self.in_flight -= 1
        now = self.now_s()
        for child in self.children[req.request_id]:
            due_s = now + child.think_s
            row = {"request_id": child.request_id, "follows": req.request_id,
                   "follows_success": rec.success, "due_s": due_s, "sent_s": None}
            self._rows[child.request_id] = row
            self.follow_ups.append(row)
            self._push(due_s, child, None)
        self.changed.set()

    def _free(self) -> bool:
        return self.cap is None or self.in_flight < self.cap

    async def run(self) -> None:
        """Until every request has been sent and has finished."""
        reached = 0.0  # the due time a finished sleep waited for (a clock may wake early)
        while self.sent < self.total:
            now = max(self.now_s(), reached)
            while self.due and self.due[0][0] <= now and self._free():
                _, _, req, target_arrival_s = heapq.heappop(self.due)
                if req.request_id in self._rows:
                    self._rows[req.request_id]["sent_s"] = now
                self.in_flight += 1
                self.sent += 1
                self.tasks.append(self.spawn(self._one(req, target_arrival_s)))
            if self.sent == self.total:
                break
            if not self.due and self.in_flight == 0:
                raise RuntimeError(f"{self.total - self.sent} requests can never be sent: "
                                   "the requests they follow were never sent")
            self.changed.clear()
            next_due = self.due[0][0] if self.due and self._free() else None
            if await self._wait(None if next_due is None else next_due - now) \
                    and next_due is not None:
                reached = max(reached, next_due)
        await asyncio.gather(*self.tasks)

    async def _wait(self, timeout_s: float | None) -> bool:
        """Until a request finishes or `timeout_s` passes on the runner's clock; True when the
        time passed (an early wake-up, within the clock's resolution, counts as passed)."""
        changed = asyncio.ensure_future(self.changed.wait())
        slept = None if timeout_s is None else asyncio.ensure_future(self.sleep(timeout_s))
        waits = {changed} if slept is None else {changed, slept}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return slept is not None and slept.done() and not slept.cancelled()
