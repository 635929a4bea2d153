"""The FastAPI app: lifespan (start-up in the background, then the engine loop), auth,
errors, service routes.

    build_app(EngineConfig.from_kwargs(model, **knobs), served_model_name=None, api_key=None)

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models (openai_routes);
GET /health, GET /metrics (Prometheus text, see metrics.py), POST /reset_prefix_cache (200
`{"success": bool}`; false while requests hold blocks), GET /openapi.json (openapi.py).

Start-up (startup.py) runs in a background thread, so the server accepts connections at once:
until the engine is built, the C++ CPU kernels are loaded and one warm-up request has run,
/health answers 503 `{"status": "starting", "phase", "reason", "elapsed_s"}` (or `"failed"`),
and every other route but /openapi.json answers 503 `{"error": ...}`. Ready: /health is 200
`{"status": "ready"}` while the engine loop runs, 503 `{"status": "stopped"}` after.

With `api_key`, every route but /health and /metrics needs `Authorization: Bearer <key>` (401
otherwise; the protocol's `APIKeyMiddleware`): /v1/*, /reset_prefix_cache, /kv_transfer_info,
/openapi.json and unknown paths too. /health and /metrics stay open, as in vLLM (a load
balancer and Prometheus poll them without credentials); vLLM guards only /v1/*, this server
every other path as well.
Every error is `{"error": {"message", "type", "param", "code"}}`; an unexpected exception is
a 500 for that request only. `app.state.engine` is the AsyncEngine once ready (tests read the
KV pool through `app.state.engine.submit(fn)`), `app.state.serving` the routes' shared state,
`app.state.startup` the Startup.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from workbench.config import EngineConfig
from workbench.engine.async_engine import AsyncEngine
from workbench.engine.llm_engine import LLMEngine
from workbench.entrypoints.openai.protocol.auth import APIKeyMiddleware
from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.http import DEFAULT_MAX_BODY_BYTES, add_error_handlers
from workbench.entrypoints.openai.protocol.json_values import MAX_ITEMS
from workbench.metrics.loggers import LoggingStatLogger
from workbench.server import openapi
from workbench.server.metrics import ServerMetrics
from workbench.server.openai_routes import ServingState, router, serving_state
from workbench.server.startup import Startup

logger = logging.getLogger(__name__)
_NOT_GATED = ("/health", "/openapi.json")  # answered while warming up


def build_app(
    engine_config: EngineConfig,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    on_startup_failure: Callable[[str], None] | None = None,
    log_stats: bool = False,
) -> FastAPI:
    """An app whose lifespan starts the engine in the background (see startup.py) and stops
    it at shutdown; `on_startup_failure(message)` is called if start-up fails. `log_stats`:
    vLLM's periodic engine log line from the end of the warm-up on (`workbench serve`: on)."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes ({max_body_bytes}) must be >= 1")
    model_path = engine_config.model_config.model
    name = served_model_name or model_path

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        def on_ready(llm_engine: LLMEngine) -> None:  # on the start-up thread
            if log_stats:  # from here on: the warm-up is not traffic
                llm_engine.stat_logger = LoggingStatLogger(device=engine_config.device)
            engine = AsyncEngine(llm_engine).start()
            app.state.serving = ServingState(
                engine=engine, model_name=name, model_path=model_path,
                metrics=ServerMetrics(engine, name, llm_engine.max_model_len),
                max_body_bytes=max_body_bytes, created=int(time.time()),
                max_items=max(llm_engine.max_model_len, MAX_ITEMS),
            )
            app.state.engine = engine

        startup = Startup(engine_config, on_ready, on_startup_failure)
        app.state.startup = startup
        startup.start()
        try:
            yield
        finally:
            startup.cancel()
            engine: AsyncEngine | None = getattr(app.state, "engine", None)
            if engine is not None:
                await asyncio.to_thread(_stop_engine, engine)

    app = FastAPI(title="workbench", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.include_router(router)
    _add_service_routes(app)
    add_error_handlers(app, logger, "serving", echo_request_id=True)
    openapi.install(app, api_key=bool(api_key))
    app.add_middleware(_ReadinessGate)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app


def _stop_engine(engine: AsyncEngine) -> None:
    engine.stop(30.0)
    engine.engine.shutdown()  # TP: stop the worker ranks now, not at interpreter exit


def _add_service_routes(app: FastAPI) -> None:
    @app.get("/health", **openapi.health_route())
    async def health(request: Request) -> JSONResponse:
        startup: Startup | None = getattr(request.app.state, "startup", None)
        if startup is None:
            return JSONResponse({"status": "starting", "reason": "start-up has not begun"}, 503)
        if not startup.ready:
            return JSONResponse(startup.health(), 503)
        engine: AsyncEngine = request.app.state.engine
        if not engine.is_running:
            return JSONResponse({"status": "stopped",
                                 "reason": "the engine loop is not running"}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", **openapi.metrics_route())
    async def metrics(request: Request) -> Response:
        m = serving_state(request).metrics
        await m.refresh()
        return Response(m.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/kv_transfer_info", **openapi.kv_transfer_info_route())
    async def kv_transfer_info(request: Request) -> JSONResponse:
        """The KV connector's side channel: a proxy names it in a prefill request to have
        the prefill's KV pushed to this (decode) instance."""
        info = serving_state(request).engine.engine.kv_transfer_info()
        if info is None:
            raise APIError("this instance has no KV connector with a side channel (serve "
                           "with --kv-transfer-config and kv_connector P2pConnector)", 404)
        return JSONResponse(info)

    @app.post("/reset_prefix_cache", **openapi.reset_route())
    async def reset_prefix_cache(request: Request, reset_external: bool = False) -> JSONResponse:
        """The prefix cache; `reset_external=true` (vLLM's) the KV connector's tiers too."""
        engine = serving_state(request).engine
        done = await asyncio.wrap_future(
            engine.submit(lambda e: e.reset_prefix_cache(reset_connector=reset_external)))
        return JSONResponse({"success": bool(done)})


class _ReadinessGate:
    """503 `{"error": ...}` for every route but /health and /openapi.json until start-up is
    done (pure ASGI: streams untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in _NOT_GATED:
            startup: Startup | None = getattr(scope["app"].state, "startup", None)
            if startup is None or not startup.ready:
                reason = startup.health()["reason"] if startup else "start-up has not begun"
                err = APIError(f"the server is not ready: {reason}", 503)
                await JSONResponse(err.body(), status_code=503)(scope, receive, send)
                return
        await self.app(scope, receive, send)
