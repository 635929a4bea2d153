"""One `workbench serve` replica as a Ray actor: the actor runs the server as a process on its
node, watches it and stops it; the router reaches the server over HTTP only.

    ray.remote(ReplicaServer).options(placement bundle i, max_restarts=-1).remote(args, 1, 300)
      __init__      a free port on the node's IP; the replica's process
                    (`pool.replica_process`: `python -m workbench.cli serve *args --host IP
                    --port P`, its own process group, OMP_NUM_THREADS = threads, as the local
                    pool's replicas) launched by a thread that then waits for it to exit
      wait_ready()  blocks until its /health is 200 -> info(); raises on a failed start-up
      wait_stopped()  blocks while the server runs: the pool's liveness watch on it
      stop()        graceful: the server's process group stopped (SIGTERM, then SIGKILL)
      restart()     stop(), then the actor's process exits so that Ray restarts the actor:
                    how the pool retires a replica it marked dead (a new incarnation)

Place in the flow: `ray_pool.RayReplicaPool` creates one actor per replica and routes to the
URL it reports. The server runs on the actor's node in a process the actor owns and stops,
so a node lost takes both with it; Ray then restarts the actor (its bundle rescheduled on a
node with room) and `__init__` runs again: a new port, a new URL, a new `incarnation` id. The
pool never kills an actor whose server runs (`restart()` stops the server first), so no server
outlives its actor but for a crash of the actor's process itself.

Bound to the node's IP (`ray.util.get_node_ip_address()`), the address the router and the
other nodes reach it by. A disaggregated replica's P2pConnector side channel is bound there
too (`kv_connector_extra_config.side_channel_host`, unless the flags give one), so a decode
replica on another node can read (or be pushed) the KV. The server's output goes to
`<temp dir>/workbench-replica-<incarnation>.log` on the node (the actor's Ray worker log names
it; `info()["log_path"]`); a failed start-up's reason is the actor's error.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from workbench.router.disagg_pool import FLAG, KV_CONNECTOR, split_kv_transfer_config
from workbench.router.pool import replica_process

STARTUP_FAILED = "start-up failed in phase"  # `workbench serve`'s last line when it fails


def with_side_channel_host(serve_args: list[str], host: str) -> list[str]:
    """`serve_args` whose P2pConnector --kv-transfer-config (if any) binds its side channel to
    `host`, unless it names a side_channel_host itself; other flags unchanged."""
    rest, kv = split_kv_transfer_config(serve_args)
    if kv is None or kv.get("kv_connector") != KV_CONNECTOR:
        return serve_args
    extra = kv.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict) or "side_channel_host" in extra:
        return serve_args
    kv = {**kv, "kv_connector_extra_config": {**extra, "side_channel_host": host}}
    return [*rest, FLAG, json.dumps(kv)]


def startup_failure(error: str) -> str:
    """Why a replica did not start, in one line: `workbench serve`'s own "start-up failed in
    phase ..." line when its output has one, else the first line of `error`."""
    lines = [ln for ln in error.splitlines() if STARTUP_FAILED in ln]
    if lines:
        return lines[-1][lines[-1].index(STARTUP_FAILED):]
    return error.strip().splitlines()[0] if error.strip() else "unknown"


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ReplicaServer:
    """The actor class (`ray.remote(ReplicaServer)` in the pool)."""

    def __init__(self, serve_args: list[str], threads: int, ready_timeout_s: float = 300.0
                 ) -> None:
        import ray

        self.incarnation = uuid.uuid4().hex
        self.node_ip = str(ray.util.get_node_ip_address())
        self.node_id = ray.get_runtime_context().get_node_id()
        port = free_port(self.node_ip)
        self.url = f"http://{self.node_ip}:{port}"
        log = Path(tempfile.gettempdir()) / f"workbench-replica-{self.incarnation}.log"
        # the engine's "ray" TP backend joins this cluster (ray.init reads RAY_ADDRESS); the
        # GPUs Ray gave the actor (CUDA_VISIBLE_DEVICES) are the server's too
        ray_env = {"RAY_ADDRESS": str(ray.get_runtime_context().gcs_address)}
        self.process = replica_process(with_side_channel_host(serve_args, self.node_ip),
                                       self.node_ip, port, threads, ready_timeout_s, log,
                                       env=ray_env)
        print(f"workbench serve at {self.url}: its log is {log} on this node", flush=True)
        self.failed: str | None = None  # why start-up failed
        self.exit_code: int | None = None
        self._ready = threading.Event()  # start-up is over, ready or failed
        self._stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="workbench-serve")
        self.thread.start()

    def _run(self) -> None:
        """Launch, wait for /health, then wait for the server to exit."""
        try:
            self.process.start()
        except Exception as e:  # noqa: BLE001 - reported by wait_ready and wait_stopped
            self.failed = startup_failure(str(e))
            return
        finally:
            self._ready.set()
        proc = self.process.proc
        if self._stopping:  # stop() came while it started
            self.process.stop()
        elif proc is not None:
            proc.wait()
        self.exit_code = proc.returncode if proc is not None else self.process.returncode

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "node_id": self.node_id, "node_ip": self.node_ip,
                "pid": self.process.pid, "incarnation": self.incarnation,
                "log_path": str(self.process.log_path)}

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """info() once /health answers 200; RuntimeError when start-up failed or the server
        stopped, TimeoutError after `timeout_s`."""
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"not ready at {self.url} in {timeout_s:.0f} s")
        if self.failed is not None:
            raise RuntimeError(self.failed)
        if not self.thread.is_alive():
            raise RuntimeError("its server stopped")
        return self.info()

    def wait_stopped(self) -> str:
        """Block while the server runs; why it stopped."""
        self.thread.join()
        if self.failed is not None:
            return f"its server stopped ({self.failed})"
        if self._stopping:
            return "its server stopped"
        return f"its server exited with code {self.exit_code}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self.process.stop()
        self.thread.join(timeout_s)

    def restart(self) -> None:
        """Stop the server, then end this process: Ray restarts the actor (max_restarts), whose
        `__init__` starts a new server (os._exit: an exit Ray counts as a failure)."""
        self.stop()
        os._exit(1)
