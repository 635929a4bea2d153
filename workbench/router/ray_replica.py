"""One `workbench serve` replica as a Ray actor: the server runs in the actor's own process.

    ray.remote(ReplicaServer).options(placement bundle i, max_restarts=-1).remote(args, 1)
      __init__      bind (node IP, free port); build `workbench serve`'s app from `args`
                    (server.serve.parse_args + server.app.build_app); uvicorn in a thread
      wait_ready()  blocks until its /health is 200 -> info(); raises on a failed start-up
      wait_stopped()  blocks while the server runs: the pool's liveness watch on it
      stop()        graceful: the server and its engine shut down

Place in the flow: `ray_pool.RayReplicaPool` creates one actor per replica and routes to the
URL it reports. The server lives and dies with the actor's process, so a node lost takes
the server with it; Ray then restarts the actor (its bundle rescheduled on a node with room)
and `__init__` runs again: a new port, a new URL, a new `incarnation` id.

Bound to the node's IP (`ray.util.get_node_ip_address()`), the address the router and the
other nodes reach it by. A disaggregated replica's P2pConnector side channel is bound there
too (`kv_connector_extra_config.side_channel_host`, unless the flags give one), so a decode
replica on another node can read (or be pushed) the KV. OMP_NUM_THREADS and torch's thread
count are `threads` (TP ranks the engine spawns inherit them), as the local pool does.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from workbench.router.disagg_pool import FLAG, KV_CONNECTOR, split_kv_transfer_config

HEALTH_POLL_S = 0.25


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


class ReplicaServer:
    """The actor class (`ray.remote(ReplicaServer)` in the pool)."""

    def __init__(self, serve_args: list[str], threads: int) -> None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
        import logging

        import ray
        import torch
        import uvicorn

        from workbench.server.app import DEFAULT_MAX_BODY_BYTES, build_app
        from workbench.server.serve import parse_args

        torch.set_num_threads(threads)
        self.incarnation = uuid.uuid4().hex
        self.node_ip = str(ray.util.get_node_ip_address())
        self.node_id = ray.get_runtime_context().get_node_id()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.node_ip, 0))
        port = sock.getsockname()[1]
        self.url = f"http://{self.node_ip}:{port}"
        args, config = parse_args([*with_side_channel_host(serve_args, self.node_ip),
                                   "--host", self.node_ip, "--port", str(port)])
        logging.basicConfig(level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.failed: list[str] = []
        self.server: Any = None

        def on_startup_failure(message: str) -> None:  # on the start-up thread
            self.failed.append(message)
            if self.server is not None:
                self.server.should_exit = True

        app = build_app(config, served_model_name=args.served_model_name, api_key=args.api_key,
                        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                        on_startup_failure=on_startup_failure,
                        log_stats=not args.disable_log_stats)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level,
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True, name="workbench-serve")
        self.thread.start()

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "node_id": self.node_id, "node_ip": self.node_ip,
                "pid": os.getpid(), "incarnation": self.incarnation}

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """info() once /health answers 200; RuntimeError when start-up failed or the server
        stopped, TimeoutError after `timeout_s`."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            if self.failed:
                raise RuntimeError(f"start-up failed in phase {self.failed[0]}")
            if not self.thread.is_alive():
                raise RuntimeError("its server stopped during start-up")
            try:
                if httpx.get(self.url + "/health", timeout=5.0,
                             trust_env=False).status_code == 200:
                    return self.info()
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready at {self.url} in {timeout_s:.0f} s")
            time.sleep(HEALTH_POLL_S)

    def wait_stopped(self) -> str:
        """Block while the server runs; why it stopped."""
        self.thread.join()
        if self.failed:
            return f"its server stopped (start-up failed in phase {self.failed[0]})"
        return "its server stopped"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.server is not None:
            self.server.should_exit = True
        self.thread.join(timeout_s)
