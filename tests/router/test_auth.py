"""The router behind its API key: every route of the app (enumerated from `app.routes`, so a
new route is covered the day it is added) answers 401 with the OpenAI error body without the
key, except /health and /metrics; the router sends the key on its own calls to the replicas;
`--api-key` (the replicas' flag) is the router's key; a busy --port is one clean line."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.router.fakes import FakeReplica, fake_transport
from tests.server.test_auth_openapi import served_routes
from workbench.cli import main as workbench_main
from workbench.config.named_models import bundled_checkpoint
from workbench.entrypoints.openai.protocol.auth import OPEN_PATHS
from workbench.models.tokenizer import load_tokenizer
from workbench.router.app import build_router_app
from workbench.router.cli import parse_args
from workbench.router.config import RouterConfig
from workbench.router.disagg_pool import url_pool
from workbench.router.pool import ReplicaPool

TOK = load_tokenizer(bundled_checkpoint())
KEY = "s3cret-router-key"
AUTH_ERROR = {"message": "missing or wrong API key; send 'Authorization: Bearer <key>'",
              "type": "AuthenticationError", "param": None, "code": 401}
BODY = {"model": "m", "prompt": list(range(20, 40)), "max_tokens": 2}


@contextmanager
def keyed_router(disaggregated: bool) -> Iterator[tuple[TestClient, FastAPI, list[Any]]]:
    seen: list[tuple[str, str | None]] = []  # (path, Authorization) of calls to replicas
    if disaggregated:
        replicas = [FakeReplica("p0"), FakeReplica("d0")]
        pool = url_pool(["http://p0"], ["http://d0"])
        config = RouterConfig(num_prefill=1, num_decode=1, kv_push=True, block_size=16,
                              health_interval_s=3600.0)
    else:
        replicas = [FakeReplica("r0"), FakeReplica("r1")]
        pool = ReplicaPool(urls=[r.url for r in replicas])
        config = RouterConfig(num_replicas=2, block_size=16, health_interval_s=3600.0)
    inner = fake_transport(replicas)

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("authorization")))
        return await inner.handle_async_request(request)

    app = build_router_app(config, pool, TOK, transport=httpx.MockTransport(handler),
                           api_key=KEY)
    with TestClient(app) as client:
        yield client, app, seen


@pytest.mark.parametrize("disaggregated", [False, True], ids=["colocated", "disaggregated"])
def test_every_router_route_but_health_and_metrics_needs_the_key(disaggregated: bool) -> None:
    with keyed_router(disaggregated) as (client, app, seen):
        all_routes = served_routes(app)
        assert {p for _, p in all_routes} >= {
            "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
            "/reset_prefix_cache", "/router/replicas", "/router/requests"}
        for method, path in all_routes:
            if path in OPEN_PATHS:
                continue
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
                r = client.request(method, path, headers=headers, json=BODY)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json() == {"error": AUTH_ERROR}
        assert not [p for p, _ in seen if p.endswith("completions")]  # nothing forwarded
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        auth = {"Authorization": f"Bearer {KEY}"}
        r = client.get("/router/replicas", headers=auth)
        assert r.status_code == 200 and len(r.json()["replicas"]) == 2
        assert client.get("/router/requests", headers=auth).status_code == 200
        assert client.post("/reset_prefix_cache", headers=auth).status_code == 200
        assert client.get("/no/such/route", headers=auth).status_code == 404
        r = client.post("/v1/completions", headers=auth, json=BODY)
        assert r.status_code == 200, r.text
    # every call the router made to a replica carried the key: its own (scrapes,
    # /kv_transfer_info, /reset_prefix_cache) and the client's request
    assert seen and all(a == f"Bearer {KEY}" for _, a in seen), seen
    if disaggregated:
        assert ("/kv_transfer_info", f"Bearer {KEY}") in seen


def test_without_a_key_the_router_is_open() -> None:
    replicas = [FakeReplica("r0")]
    app = build_router_app(RouterConfig(num_replicas=1, health_interval_s=3600.0),
                           ReplicaPool(urls=[replicas[0].url]), TOK,
                           transport=fake_transport(replicas))
    with TestClient(app) as client:
        assert client.get("/router/replicas").status_code == 200
        assert client.post("/v1/completions", json=BODY).status_code == 200


def test_the_replicas_api_key_is_the_routers() -> None:
    model = str(bundled_checkpoint())
    args, _, serve, _ = parse_args(["--model", model, "--api-key", KEY])
    assert args.api_key == KEY
    assert serve[serve.index("--api-key") + 1] == KEY  # every replica gets it
    args, _, _, _ = parse_args(["--model", model])
    assert args.api_key is None


@pytest.mark.parametrize("verb", ["router", "serve"])
def test_a_busy_port_is_one_clean_line(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            workbench_main([verb, "--model", str(bundled_checkpoint()), "--port", str(port)])
    what = "the router" if verb == "router" else "workbench serve"
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        f"workbench {verb}: port {port} on 127.0.0.1 is already in use (another server is "
        f"listening there): stop it, or start {what} on another port with --port N\n")


def test_the_replicas_key_is_never_logged(caplog: pytest.LogCaptureFixture,
                                          tmp_path: Path) -> None:
    """A replica that fails to start: the router's log line and error show `--api-key ***`
    (the command line and the replica's log tail)."""
    pool = ReplicaPool(["--model", str(tmp_path / "no-model"), "--api-key", KEY], 1,
                       ready_timeout_s=120.0, log_dir=tmp_path)
    with caplog.at_level(logging.DEBUG), pytest.raises(RuntimeError) as e:
        pool.start()
    assert "--api-key ***" in str(e.value) and "--api-key ***" in caplog.text
    assert KEY not in str(e.value) and KEY not in caplog.text
