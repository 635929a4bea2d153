"""Scheduling policies: the scheduler's waiting queue, one class per policy.

    fcfs      FCFSRequestQueue (a deque): arrival order; a preempted request goes back to the
              front; the newest running request is preempted first.
    priority  PriorityRequestQueue (a heap): a *lower* `priority` value is served first, ties
              broken by arrival (vLLM's rule); a preempted request goes back into the heap; the
              running request with the highest (priority, arrival) is preempted first.

A policy decides both orders: whom to serve next (`pop`) and whom to preempt when blocks run
out (`preemption_victim`). Adding one is a class here with the same methods, a row in
REQUEST_QUEUES, and its name in `workbench.config.SCHEDULING_POLICIES`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from workbench.core.request import Request


class FCFSRequestQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._q.append(request)

    def prepend(self, request: Request) -> None:
        self._q.appendleft(request)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, request: Request) -> None:
        self._q.remove(request)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)

    @staticmethod
    def preemption_victim(running: list[Request]) -> Request:
        """The running request to preempt (removed from `running`): the newest one."""
        return running.pop()


class PriorityRequestQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(
            self._heap, (request.priority, request.times.arrival, next(self._counter), request)
        )

    prepend = add

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (e[3] for e in sorted(self._heap))

    @staticmethod
    def preemption_victim(running: list[Request]) -> Request:
        """The running request to preempt (removed from `running`): the one served last
        under this policy (highest priority value, then latest arrival)."""
        victim = max(running, key=lambda r: (r.priority, r.times.arrival))
        running.remove(victim)
        return victim


RequestQueue = FCFSRequestQueue | PriorityRequestQueue
REQUEST_QUEUES: dict[str, type[RequestQueue]] = {
    "fcfs": FCFSRequestQueue,
    "priority": PriorityRequestQueue,
}


def make_request_queue(policy: str) -> RequestQueue:
    """The waiting queue of `policy` (one of REQUEST_QUEUES; config validated it)."""
    return REQUEST_QUEUES[policy]()
