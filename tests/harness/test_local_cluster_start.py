"""LocalCluster's node starts (workbench.testing.local_cluster): when Ray's own start-up fails
(its GCS missing an RPC deadline, a raylet not registering within Ray's fixed 30 s on a loaded
machine), what the try left is killed and the node is started again (the head on a fresh
port), up to START_ATTEMPTS tries; the last failure is raised."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from workbench.testing import local_cluster as lc


class FakeProc:
    pid = 4242


def fake_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int
                 ) -> tuple[lc.LocalCluster, list[Any]]:
    c = lc.LocalCluster(tmp_path, tracking=False)
    events: list[Any] = []

    def spawn(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        events.append(("spawn", next(a for a in cmd if a.startswith(("--port=", "--address=")))))
        c.groups[name] = FakeProc.pid
        return FakeProc()  # type: ignore[return-value]

    def wait(proc: object, name: str, deadline: float) -> None:
        events.append(("wait", name))
        if sum(e[0] == "wait" for e in events) <= failures:
            raise AssertionError("The current node timed out during startup.")

    monkeypatch.setattr(c, "_spawn", spawn)
    monkeypatch.setattr(c, "_wait", wait)
    monkeypatch.setattr(c, "kill", lambda name: events.append(("kill", name)))
    monkeypatch.setattr(lc, "free_port", lambda: 7002)
    return c, events


def test_a_failed_head_start_is_tried_again_on_a_fresh_port(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, events = fake_cluster(tmp_path, monkeypatch, failures=1)
    assert c._start_head(7001, deadline=float("inf")) == 7002
    assert events == [("spawn", "--port=7001"), ("wait", "head"), ("kill", "head"),
                      ("spawn", "--port=7002"), ("wait", "head")]


def test_a_failed_worker_start_is_tried_again(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    c, events = fake_cluster(tmp_path, monkeypatch, failures=2)
    c.address = "192.0.2.2:7001"
    c._start_worker(deadline=float("inf"))
    assert events == [("spawn", "--address=192.0.2.2:7001"), ("wait", "worker"),
                      ("kill", "worker")] * 2 + [("spawn", "--address=192.0.2.2:7001"),
                                                  ("wait", "worker")]


def test_the_last_failure_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lc.START_ATTEMPTS == 3
    c, events = fake_cluster(tmp_path, monkeypatch, failures=3)
    with pytest.raises(AssertionError, match="timed out during startup"):
        c._start_head(7001, deadline=float("inf"))
    assert [e[0] for e in events] == ["spawn", "wait", "kill"] * 2 + ["spawn", "wait"]


def test_no_new_try_past_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, events = fake_cluster(tmp_path, monkeypatch, failures=1)
    with pytest.raises(AssertionError, match="timed out during startup"):
        c._start_head(7001, deadline=0.0)
    assert [e[0] for e in events] == ["spawn", "wait"]
