"""A Ray replica's actor without Ray: it starts its server as a process on the node, reports it
ready, watches it, stops it, and names why a start-up failed. `ray` is a stand-in module and
the server a stand-in process (an HTTP server answering /health, or one that fails as
`workbench serve` does); tests/cluster/test_ray_serving.py runs the real thing on a cluster."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from workbench.harness.server_process import ServerProcess
from workbench.router import ray_replica
from workbench.router.ray_replica import ReplicaServer, startup_failure

HEALTHY = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"""
FAILING = """
import sys
print("INFO: building the engine", flush=True)
sys.exit("workbench serve: start-up " + "failed in phase warm-up: RuntimeError: boom")
"""
FAKE_RAY = SimpleNamespace(
    util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"),
    get_runtime_context=lambda: SimpleNamespace(get_node_id=lambda: "node-1",
                                                gcs_address="10.0.0.1:6379"),
)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The replica processes the actor asked for; each runs the script of its --model."""
    calls: list[dict[str, Any]] = []

    def process(serve_args: list[str], host: str, port: int, threads: int,
                ready_timeout_s: float, log_path: Path | None = None,
                env: dict[str, str] | None = None) -> ServerProcess:
        calls.append({"serve_args": serve_args, "host": host, "threads": threads,
                      "env": env, "log_path": log_path})
        script = {"healthy": HEALTHY, "failing": FAILING}[serve_args[1]]
        return ServerProcess([sys.executable, "-c", script, host, str(port)],
                             f"http://{host}:{port}", ready_timeout_s=ready_timeout_s,
                             log_path=log_path, stop_timeout_s=5.0)

    monkeypatch.setattr(ray_replica, "replica_process", process)
    monkeypatch.setitem(sys.modules, "ray", FAKE_RAY)
    return calls


def test_the_actor_starts_watches_and_stops_its_server(launched: list[dict[str, Any]]) -> None:
    actor = ReplicaServer(["--model", "healthy"], 2, ready_timeout_s=60.0)
    try:
        info = actor.wait_ready(60.0)
        assert info == {"url": actor.url, "node_id": "node-1", "node_ip": "127.0.0.1",
                        "pid": actor.process.pid, "incarnation": actor.incarnation,
                        "log_path": str(launched[0]["log_path"])}
        assert launched == [{"serve_args": ["--model", "healthy"], "host": "127.0.0.1",
                             "threads": 2, "env": {"RAY_ADDRESS": "10.0.0.1:6379"},
                             "log_path": launched[0]["log_path"]}]
        assert launched[0]["log_path"].name == f"workbench-replica-{actor.incarnation}.log"
        assert httpx.get(actor.url + "/health", trust_env=False).status_code == 200
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            watch = ex.submit(actor.wait_stopped)
            actor.stop()
            assert watch.result(timeout=30) == "its server stopped"
        with pytest.raises(RuntimeError, match="^its server stopped$"):
            actor.wait_ready(1.0)
    finally:
        actor.stop()
        if launched and launched[0]["log_path"] is not None:
            launched[0]["log_path"].unlink(missing_ok=True)


def test_a_server_that_dies_ends_the_watch(launched: list[dict[str, Any]]) -> None:
    actor = ReplicaServer(["--model", "healthy"], 1, ready_timeout_s=60.0)
    try:
        actor.wait_ready(60.0)
        assert actor.process.pid is not None
        os.kill(actor.process.pid, signal.SIGKILL)
        assert actor.wait_stopped() == f"its server exited with code {-signal.SIGKILL}"
    finally:
        actor.stop()
        launched[0]["log_path"].unlink(missing_ok=True)


def test_a_failed_start_up_is_the_actors_error(launched: list[dict[str, Any]]) -> None:
    actor = ReplicaServer(["--model", "failing"], 1, ready_timeout_s=60.0)
    try:
        with pytest.raises(RuntimeError) as e:
            actor.wait_ready(60.0)
        assert str(e.value) == "start-up failed in phase warm-up: RuntimeError: boom"
        assert actor.wait_stopped() == \
            "its server stopped (start-up failed in phase warm-up: RuntimeError: boom)"
    finally:
        actor.stop()
        launched[0]["log_path"].unlink(missing_ok=True)


def test_startup_failure_is_one_line() -> None:
    error = ("server command exited with code 1 before it was ready: python -m workbench.cli "
             "serve --model m\nINFO: starting\nERROR: start-up failed while building the "
             "engine:\nworkbench serve: start-up failed in phase engine: OSError: no weights")
    assert startup_failure(error) == "start-up failed in phase engine: OSError: no weights"
    assert startup_failure("not ready at http://h:1 after 5 s\nlog tail") == \
        "not ready at http://h:1 after 5 s"
    assert startup_failure("") == "unknown"
