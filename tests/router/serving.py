"""Serve a router app (its replica pool inside) on a free loopback port in a thread, for the
tests that talk to `workbench router` over HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

READY_TIMEOUT_S = 240.0  # the replicas' start (imports, 2 CPUs shared with other work)


@contextlib.contextmanager
def serve_router(app: Any, pool: Any) -> Iterator[tuple[str, uvicorn.Server, threading.Thread]]:
    """(url, server, thread) once /health answers 200; the server and pool stopped after."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and thread.is_alive():
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        server.should_exit = True
        pool.stop()
        raise RuntimeError("the router did not become healthy")
    try:
        yield url, server, thread
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        pool.stop()  # idempotent; in case the lifespan did not finish
