"""The API key: `Authorization: Bearer <key>` on every route but /health and /metrics.

Used by the server (`workbench.server.app.build_app(api_key=...)`) and the router
(`workbench.router.app`). vLLM's `--api-key` guards only the paths under /v1 (and lets OPTIONS
through); here every other path needs the key too (/reset_prefix_cache, /kv_transfer_info,
/openapi.json, the router's /router/*, unknown paths), so nothing that changes or reveals
state is open. /health and /metrics stay open, as in vLLM: a load balancer and Prometheus poll
them without credentials. A request without the key, or with another, is a 401 with the OpenAI
error body.
"""

from __future__ import annotations

import secrets

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from workbench.entrypoints.openai.protocol.errors import APIError

OPEN_PATHS = ("/health", "/metrics")  # answered without the API key, as in vLLM
AUTH_ERROR = "missing or wrong API key; send 'Authorization: Bearer <key>'"


class APIKeyMiddleware:
    """401 without `Authorization: Bearer <api_key>` on every path but OPEN_PATHS (pure ASGI:
    streams untouched; the comparison takes the same time whatever the key sent)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        if not api_key:
            raise ValueError("api_key must be a non-empty string")
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if secrets.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        response = JSONResponse(APIError(AUTH_ERROR, 401).body(), status_code=401)
        await response(scope, receive, send)
