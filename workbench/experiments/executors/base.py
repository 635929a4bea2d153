"""The executor seam: run a list of jobs (an experiment's runs, a sweep's points) somewhere.

    executor = make_executor(ExecutorConfig("ray", address="10.0.0.1:6379"))  # factory.py
    for done in executor.run(fn, payloads, what=names.__getitem__, lost=mark, give_up=fail):
        results[done.index] = done.value          # as they finish; local: in order
    executor.close()

`fn(payload, attempt)` runs one job; `attempt` is a fresh id per try, which the job tags on
its MLflow run (`executor_attempt`) so that a try whose node died can be found and marked
KILLED (`lost(index, attempt, reason)`); the job is then submitted again, at most
`max_attempts` times, after which `give_up(index, reason)` stands in for its result.
Jobs are submitted in the order given: an experiment passes its interleaved order
(A B C A B C), and the verdict reads the results in that order whatever order they finish in.
"""

from __future__ import annotations

import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from workbench.experiments.executors.config import ExecutorConfig

ATTEMPT_TAG = "executor_attempt"  # tags each try's MLflow run (a lost one is marked KILLED)

P = TypeVar("P")
R = TypeVar("R")
LostFn = Callable[[int, str, str], None]  # (index, attempt id, reason)
GiveUpFn = Callable[[int, str], Any]  # (index, reason) -> the result that stands in


@dataclass(frozen=True)
class Done(Generic[R]):
    """One finished job: its index in the submission order, its result, and the seconds from
    its (last) submission to its result."""

    index: int
    value: R
    wall_s: float


def new_attempt() -> str:
    """A fresh attempt id (the `executor_attempt` tag)."""
    return uuid.uuid4().hex[:16]


class Executor(ABC):
    """Runs jobs; see the module docstring for the contract."""

    kind = "abstract"

    def __init__(self, config: ExecutorConfig) -> None:
        self.config = config

    @abstractmethod
    def run(self, fn: Callable[[P, str], R], payloads: Sequence[P], *,
            what: Callable[[int], str] = str, lost: LostFn | None = None,
            give_up: GiveUpFn | None = None,
            started: Callable[[int], None] | None = None) -> Iterator[Done[R]]:
        """Each payload once as `fn(payload, attempt)`; yields each `Done` as it finishes.
        `started(index)` is called when a job is submitted (local: just before it runs)."""

    def close(self) -> None:  # noqa: B027 - optional: only a cluster holds something
        """Release what the executor holds (a cluster connection)."""

    def node_preflights(self) -> list[dict[str, Any]]:
        """Each node's preflight (`node.probe_node()`), before any run; none here: only a
        cluster has nodes to probe (the Ray executor)."""
        return []


class LocalExecutor(Executor):
    """Today's behaviour: in this process, one job after the other, in order."""

    kind = "local"

    def run(self, fn: Callable[[P, str], R], payloads: Sequence[P], *,
            what: Callable[[int], str] = str, lost: LostFn | None = None,
            give_up: GiveUpFn | None = None,
            started: Callable[[int], None] | None = None) -> Iterator[Done[R]]:
        for i, payload in enumerate(payloads):
            if started is not None:
                started(i)
            t0 = time.perf_counter()
            value = fn(payload, new_attempt())
            yield Done(i, value, time.perf_counter() - t0)


def mark_lost(store: Any, attempt: str, reason: str, killed: dict[int, str], index: int,
              verb: str, what: str, again: str) -> None:
    """A job lost with its node: its MLflow run (tag ATTEMPT_TAG = `attempt`, still RUNNING)
    marked KILLED, remembered in `killed[index]`, one line on stderr:
    "workbench <verb>: <what> (run <id>) was lost: <reason>: marked KILLED; <again>"."""
    ids = store.kill_running(ATTEMPT_TAG, attempt,
                             f"killed: its node was lost ({reason}); {again}")
    if ids:
        killed[index] = ids[-1]
    print(f"workbench {verb}: {what} (run {', '.join(ids) or 'not started'}) was lost: "
          f"{reason}: marked KILLED; {again}", file=sys.stderr, flush=True)
