"""RayExecutor's loop against a scripted stand-in for the `ray` module (no cluster, < 1 s):
jobs start in the order given and never more than the nodes hold; a job whose node died is
reported (with the try's attempt id) and goes again first; after `max_attempts` it is given
up; a driver that stops early cancels what is in flight and reports it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[cluster]'")

from ray.exceptions import NodeDiedError  # noqa: E402

from workbench.experiments.executors.config import ExecutorConfig  # noqa: E402
from workbench.experiments.executors.ray_executor import RayExecutor  # noqa: E402


class FakeRay:
    """Tasks finish in submission order; `dies` says which (payload, try) lose their node."""

    def __init__(self, capacity: float, dies: set[tuple[int, int]]) -> None:
        self.capacity, self.dies = capacity, dies
        self.submitted: list[tuple[int, str, dict[str, Any]]] = []
        self.inflight: list[int] = []  # refs, oldest first
        self.max_inflight = 0
        self.cancelled: list[int] = []
        self.tries: dict[int, int] = {}
        self._results: dict[int, Any] = {}

    def remote(self, fn: Callable[[Any, str], Any] | None = None, **decorator: Any) -> Any:
        if fn is None:  # ray.remote(max_calls=...)(fn)
            self.decorator = decorator
            return self.remote
        fake = self

        class Remote:
            def options(self, **opts: Any) -> Any:
                class Bound:
                    def remote(self, payload: int, attempt: str) -> int:
                        ref = len(fake.submitted)
                        fake.submitted.append((payload, attempt, opts))
                        fake.tries[payload] = fake.tries.get(payload, 0) + 1
                        lost = (payload, fake.tries[payload]) in fake.dies
                        fake._results[ref] = (NodeDiedError("node died") if lost
                                              else fn(payload, attempt))
                        fake.inflight.append(ref)
                        fake.max_inflight = max(fake.max_inflight, len(fake.inflight))
                        return ref
                return Bound()
        return Remote()

    def wait(self, refs: list[int], num_returns: int, timeout: float) -> tuple[list[int], list]:
        first = min(refs)
        self.inflight.remove(first)
        return [first], []

    def get(self, ref: int) -> Any:
        value = self._results[ref]
        if isinstance(value, Exception):
            raise value
        return value

    def cancel(self, ref: int, force: bool) -> None:
        self.cancelled.append(ref)

    def cluster_resources(self) -> dict[str, float]:
        return {"workbench_node": self.capacity}


def executor(fake: FakeRay, **kw: Any) -> RayExecutor:
    ex = RayExecutor.__new__(RayExecutor)  # no cluster: the loop alone
    ex.config, ex.ray, ex._owns = ExecutorConfig("ray", **kw), fake, False
    return ex


def test_order_window_lost_and_given_up() -> None:
    fake = FakeRay(capacity=2, dies={(1, 1), (3, 1), (3, 2)})
    lost: list[tuple[int, str, str]] = []
    done = list(executor(fake, max_attempts=2, num_gpus=1).run(
        lambda p, attempt: p * 10, [0, 1, 2, 3], what=lambda i: f"job {i}",
        lost=lambda i, a, why: lost.append((i, a, why)),
        give_up=lambda i, why: f"gave up: {why}"))
    assert [p for p, _, _ in fake.submitted] == [0, 1, 2, 1, 3, 3]  # a rerun goes first
    assert fake.max_inflight <= 2
    assert fake.submitted[0][2] == {"name": "workbench job 0", "num_cpus": 1.0, "num_gpus": 1,
                                    "max_retries": 0, "resources": {"workbench_node": 1.0}}
    assert fake.decorator == {"max_calls": 1}  # each job in a fresh worker process
    assert [(i, why) for i, _, why in lost] == [(1, "NodeDiedError: node died")] + [
        (3, "NodeDiedError: node died")] * 2
    assert lost[0][1] == fake.submitted[1][1]  # the lost try's attempt id
    assert len({a for _, a, _ in fake.submitted}) == 6  # a fresh id per try
    assert {d.index: d.value for d in done} == {
        0: 0, 1: 10, 2: 20, 3: "gave up: lost 2 times, last: NodeDiedError: node died"}


def test_runs_per_node_widens_the_window() -> None:
    fake = FakeRay(capacity=2, dies=set())
    list(executor(fake, runs_per_node=2).run(lambda p, a: p, list(range(6))))
    assert fake.max_inflight == 4
    assert fake.submitted[0][2]["resources"] == {"workbench_node": 0.5}


def test_stopping_early_cancels_and_reports_what_is_in_flight() -> None:
    fake = FakeRay(capacity=2, dies=set())
    lost: list[int] = []
    run = executor(fake).run(lambda p, a: p, [0, 1, 2], lost=lambda i, a, why: lost.append(i))
    assert next(run).value == 0  # job 0 done, job 1 in flight, job 2 waiting
    run.close()  # the driver stops (Ctrl-C, an error)
    assert lost == [1] and fake.cancelled == [1]
    assert [p for p, _, _ in fake.submitted] == [0, 1]  # job 2 never started
