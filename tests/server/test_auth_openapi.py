"""With an API key every route but /health and /metrics needs it (/reset_prefix_cache and
/openapi.json included); the OpenAPI document describes the request models and says which
routes need the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import Route

from tests.server.conftest import ServerHandle, make_app, start_server, stop_server
from workbench.entrypoints.openai.protocol.auth import OPEN_PATHS

KEY = "s3cret"


@pytest.fixture(scope="module")
def keyed_server(model_dir: Path) -> Iterator[ServerHandle]:
    handle = start_server(make_app(model_dir, api_key=KEY))
    yield handle
    stop_server(handle)


def served_routes(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, included routers' too (so a new route is
    covered the day it is added), and one unknown path."""

    def flat(routes: list[Any]) -> Iterator[Route]:
        for r in routes:
            if hasattr(r, "original_router"):  # FastAPI >= 0.165: an included APIRouter
                yield from flat(r.original_router.routes)
            elif isinstance(r, Route):
                yield r

    found = sorted((m, r.path) for r in flat(app.routes) for m in (r.methods or ())
                   if m != "HEAD")
    return [*found, ("GET", "/no/such/route")]


def test_every_route_but_health_and_metrics_needs_the_key(keyed_server: ServerHandle) -> None:
    url = keyed_server.base_url
    all_routes = served_routes(keyed_server.app)
    assert {p for _, p in all_routes} >= {
        "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics",
        "/reset_prefix_cache", "/kv_transfer_info", "/openapi.json"}
    for method, path in all_routes:
        if path in OPEN_PATHS:
            continue
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = httpx.request(method, url + path, headers=headers, json={}, timeout=30)
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"] == {
                "message": "missing or wrong API key; send 'Authorization: Bearer <key>'",
                "type": "AuthenticationError", "param": None, "code": 401}
    assert httpx.get(f"{url}/health").json() == {"status": "ready"}
    assert httpx.get(f"{url}/metrics").status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{url}/reset_prefix_cache", headers=auth)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert httpx.get(f"{url}/openapi.json", headers=auth).status_code == 200
    assert httpx.get(f"{url}/no/such/route", headers=auth).status_code == 404
    r = httpx.post(f"{url}/v1/completions", headers=auth, timeout=60,
                   json={"prompt": "a", "max_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_openapi_document(keyed_server: ServerHandle) -> None:
    doc = httpx.get(f"{keyed_server.base_url}/openapi.json",
                    headers={"Authorization": f"Bearer {KEY}"}).json()
    assert doc["openapi"].startswith("3.1")
    ops = {(m.upper(), p): op for p, item in doc["paths"].items() for m, op in item.items()}
    assert set(ops) == {("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                        ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"),
                        ("POST", "/reset_prefix_cache"), ("GET", "/kv_transfer_info")}
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http",
                                                               "scheme": "bearer"}}
    for key, op in ops.items():
        open_route = key[1] in ("/health", "/metrics")
        assert ("security" in op) is not open_route, key
    body = ops[("POST", "/v1/completions")]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/CompletionRequest"}
    assert set(ops[("POST", "/v1/completions")]["responses"]) == {
        "200", "400", "401", "404", "413", "500", "503"}
    assert set(ops[("POST", "/v1/completions")]["responses"]["200"]["content"]) == {
        "application/json", "text/event-stream"}
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["n"] == {"default": 1, "maximum": 16, "minimum": 1, "title": "N",
                          "type": "integer"}
    assert props["presence_penalty"]["enum"] == [None, 0]
    assert props["logprobs"]["enum"] == [None, False]
    assert props["logit_bias"]["enum"] == [None, {}]
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["required"] == ["messages"] and chat["additionalProperties"] is True
    assert {"ChatMessage", "ContentPart", "StreamOptions", "ErrorResponse", "Health",
            "CompletionResponse", "ChatCompletionResponse", "ModelList"} <= set(
        doc["components"]["schemas"])


def test_openapi_is_open_without_a_key(idle_server: ServerHandle) -> None:
    doc = httpx.get(f"{idle_server.base_url}/openapi.json").json()
    assert "securitySchemes" not in doc["components"]
    assert all("security" not in op for item in doc["paths"].values() for op in item.values())
