"""Server fixtures: the app under uvicorn in a background thread on a free 127.0.0.1 port.

A real socket (not an ASGI transport) so that the `openai` client, streaming and client
disconnects behave as in production. `ServerHandle.free_blocks()` reads the KV pool through
`app.state.engine.submit(...)`, between engine steps.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from workbench.config import EngineConfig
from workbench.config.named_models import bundled_checkpoint
from workbench.engine.async_engine import AsyncEngine
from workbench.server.app import build_app

ENGINE_KW: dict[str, Any] = dict(
    dtype="float32", max_model_len=256, block_size=16, num_gpu_blocks_override=600,
)
MODEL_NAME = "tiny-llama"


@dataclass
class ServerHandle:
    app: FastAPI
    base_url: str
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def engine(self) -> AsyncEngine:
        return self.app.state.engine  # type: ignore[no-any-return]

    @property
    def total_blocks(self) -> int:
        return self.engine.engine.num_blocks - 1  # block 0 is the null block

    def free_blocks(self) -> int:
        fut = self.engine.submit(lambda e: e.scheduler.kv_cache_manager.num_free_blocks)
        return int(fut.result(timeout=30))

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until no request is in flight and every KV block is free again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.engine.num_in_flight() == 0 and self.free_blocks() == self.total_blocks:
                return
            time.sleep(0.05)
        raise AssertionError(
            f"not idle after {timeout_s}s: {self.engine.num_in_flight()} in flight, "
            f"{self.free_blocks()}/{self.total_blocks} blocks free"
        )

    def metrics(self) -> dict[str, float]:
        """/metrics parsed by prometheus_client: {sample name + sorted labels: value}."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())
                                  if k not in ("model_name", "engine"))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out


def start_server(app: FastAPI, timeout_s: float = 600.0) -> ServerHandle:
    """Serve `app` and wait for /health 200 (503 while it warms up: on a cold kernel cache the
    C++ CPU kernels are built first, minutes on a slow machine)."""
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every JSON answer on a kept-alive connection waits ~40 ms (Nagle + delayed
    # ACK; uvicorn writes the headers and the body separately). uvicorn's own host/port
    # sockets have it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError("the server thread exited during startup")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return ServerHandle(app, url, server, thread)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server did not become healthy within {timeout_s}s")


def stop_server(handle: ServerHandle) -> None:
    handle.server.should_exit = True
    handle.thread.join(timeout=30)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return bundled_checkpoint()


def make_app(model_dir: Path, **kwargs: Any) -> FastAPI:
    config = EngineConfig.from_kwargs(str(model_dir), **ENGINE_KW)
    return build_app(config, served_model_name=MODEL_NAME, **kwargs)


@pytest.fixture(scope="session")
def server(model_dir: Path) -> Iterator[ServerHandle]:
    handle = start_server(make_app(model_dir))
    yield handle
    stop_server(handle)


@pytest.fixture()
def idle_server(server: ServerHandle) -> Iterator[ServerHandle]:
    """The shared server, checked idle with every block free before and after the test."""
    server.wait_idle()
    yield server
    server.wait_idle()
