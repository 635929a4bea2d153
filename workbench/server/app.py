"""The FastAPI app: lifespan (LLMEngine + AsyncEngine loop), auth, errors, service routes.

    build_app(EngineConfig.from_kwargs(model, **knobs), served_model_name=None, api_key=None)

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models (openai_routes);
GET /health (200 while the engine loop runs, else 503), GET /metrics (Prometheus text, see
metrics.py), POST /reset_prefix_cache (200 `{"success": bool}`; false while requests hold
blocks). With `api_key`, every /v1/* route needs `Authorization: Bearer <key>` (401
otherwise); /health and /metrics stay open, as in vLLM. Every error is
`{"error": {"message", "type", "param", "code"}}`; an unexpected exception is a 500 for that
request only. `app.state.engine` is the AsyncEngine (tests read the KV pool through
`app.state.engine.submit(fn)`), `app.state.serving` the routes' shared state.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from workbench.config import EngineConfig
from workbench.engine.async_engine import AsyncEngine
from workbench.engine.llm_engine import LLMEngine
from workbench.server.metrics import ServerMetrics
from workbench.server.openai_routes import ServingState, router, serving_state
from workbench.server.protocol import APIError

logger = logging.getLogger(__name__)
DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB


def build_app(
    engine_config: EngineConfig,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """An app whose lifespan builds the engine from `engine_config` and runs its loop."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes ({max_body_bytes}) must be >= 1")
    model_path = engine_config.model_config.model
    name = served_model_name or model_path

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        llm_engine = await asyncio.to_thread(LLMEngine, engine_config)
        engine = AsyncEngine(llm_engine).start()
        app.state.engine = engine
        app.state.serving = ServingState(
            engine=engine, model_name=name, model_path=model_path,
            metrics=ServerMetrics(engine, name, llm_engine.max_model_len),
            max_body_bytes=max_body_bytes, created=int(time.time()),
        )
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop, 30.0)

    app = FastAPI(title="workbench", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.include_router(router)
    _add_service_routes(app)
    _add_error_handlers(app)
    if api_key:
        app.add_middleware(_APIKeyMiddleware, api_key=api_key)
    return app


def _add_service_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> Response:
        engine: AsyncEngine | None = getattr(request.app.state, "engine", None)
        ok = engine is not None and engine.is_running
        return Response(status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        m = serving_state(request).metrics
        await m.refresh()
        return Response(m.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        engine = serving_state(request).engine
        done = await asyncio.wrap_future(engine.submit(lambda e: e.reset_prefix_cache()))
        return JSONResponse({"success": bool(done)})


def _error(err: APIError, request: Request) -> JSONResponse:
    headers = {}
    rid = request.headers.get("x-request-id")
    if rid and len(rid) <= 256 and rid.isprintable():
        headers["x-request-id"] = rid
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error(exc, request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(APIError(str(exc.detail), exc.status_code), request)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error serving %s", request.url.path)
        return _error(APIError(f"internal error: {type(exc).__name__}: {exc}", 500), request)


class _APIKeyMiddleware:
    """401 for /v1/* without `Authorization: Bearer <api_key>` (pure ASGI: streams untouched)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/v1"):
            await self.app(scope, receive, send)
            return
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        if secrets.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        body = APIError("missing or wrong API key; send 'Authorization: Bearer <key>'", 401)
        response = JSONResponse(body.body(), status_code=401)
        await response(scope, receive, send)
