"""The router's FastAPI app: OpenAI routes forwarded to replicas, health, metrics, replicas.

    build_router_app(RouterConfig(...), ReplicaPool(serve_args, n), tokenizer)

Lifespan: start the pool (every replica launched at once; startup ends when all answer
/health, so the router's own /health is 200 only then), watch the replicas every
`health_interval_s` (a replica whose process exited or whose Ray actor died, or, for a pool
of URLs, whose /health refuses the connection, is marked dead; a replica the pool restarted,
`RayReplicaPool`, is routed to again), and on shutdown stop every replica.

Routes:
    POST /v1/completions, /v1/chat/completions   validated and tokenized (`prompts`), routed
                                                 and forwarded (`forward.Router`)
    GET  /v1/models                              the first live replica's answer
    GET  /health                                 200 while at least one replica is alive
                                                 (disaggregated: a decode replica)
    GET  /metrics                                `metrics.RouterCollector` (scrapes replicas)
    POST /reset_prefix_cache                     every live replica's; success if all did
    GET  /router/replicas                        JSON: each replica's role, url, pid, alive,
                                                 counts
    GET  /router/requests                        JSON: the disaggregated router's last
                                                 per-request records (`disagg.DisaggRecord`)

With `config.disaggregated` (num_prefill, num_decode >= 1) the router is a
`disagg.DisaggRouter`: a prefill leg on a prefill replica, then the decode leg.

With `api_key` (`workbench router --api-key KEY`, the replicas' key too) every route but
/health and /metrics needs `Authorization: Bearer KEY` (401 otherwise, the protocol's
`APIKeyMiddleware`, as on a replica), and the router sends the key on its own calls to the
replicas (health checks, scrapes, /kv_transfer_info); clients' requests go on with the
client's own header. Bodies, errors and streams use the protocol package
(`workbench.entrypoints.openai.protocol`); the router reaches the replicas over HTTP only and
imports nothing of `workbench.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from workbench.entrypoints.openai.protocol.auth import APIKeyMiddleware
from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.http import (
    DEFAULT_MAX_BODY_BYTES,
    add_error_handlers,
    decode_json,
    read_body,
)
from workbench.router.config import RouterConfig
from workbench.router.disagg import DisaggRouter
from workbench.router.forward import Router, forward_headers
from workbench.router.metrics import RouterCollector
from workbench.router.pool import Replica, ReplicaPool
from workbench.router.prompts import routed_request

logger = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 5.0


def build_router_app(config: RouterConfig, pool: ReplicaPool, tokenizer: Any,
                     max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                     transport: httpx.AsyncBaseTransport | None = None,
                     api_key: str | None = None) -> FastAPI:
    """An app whose lifespan starts `pool` and routes to it with `config.policy` (or, when
    disaggregated, `config.prefill_policy` and `config.decode_policy`). `transport`: how the
    replicas are reached (default: HTTP; tests pass a mock). `api_key`: the key every route
    but /health and /metrics needs, and that the router sends to the replicas."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(pool.start)
        router: Router
        if config.disaggregated:
            router = DisaggRouter(pool, config, tokenizer, transport=transport)
        else:
            router = Router(pool, config.make_policy(), config, tokenizer, transport=transport)
        if api_key:  # the router's own calls (a client's request carries the client's header)
            router.client.headers["Authorization"] = f"Bearer {api_key}"
        app.state.router = router
        registry = CollectorRegistry()
        registry.register(RouterCollector(router))
        app.state.registry = registry
        watcher = asyncio.create_task(_watch(router, config.health_interval_s))
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await router.aclose()
            await asyncio.to_thread(pool.stop)

    app = FastAPI(title="workbench router", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)

    async def complete(request: Request, kind: str) -> Response:
        router: Router = request.app.state.router
        router.client_requests += 1
        body = await read_body(request, max_body_bytes)
        routed = await asyncio.to_thread(  # decoding and tokenizing: off the event loop
            lambda: routed_request(kind, decode_json(body), tokenizer))
        headers = forward_headers(request.headers)
        if routed.stream:
            return await router.forward_stream(routed, headers)
        task = asyncio.ensure_future(router.forward_json(routed, headers))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, task))
        try:
            return await task
        except asyncio.CancelledError:
            if not watcher.done() or watcher.cancelled():
                raise  # the router itself is being cancelled
            return Response(status_code=499)  # the client went away; nobody reads this
        finally:
            watcher.cancel()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, "chat")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        router: Router = request.app.state.router
        for r in router.pool.live():
            try:
                resp = await router.client.get(r.base_url + "/v1/models", timeout=30.0,
                                               headers=forward_headers(request.headers))
            except httpx.TransportError as e:
                router.replica_failed(r, f"{type(e).__name__}: {e}")
                continue
            return Response(resp.content, resp.status_code,
                            media_type=resp.headers.get("content-type"))
        raise APIError("no live replica", 503)

    @app.get("/health")
    async def health(request: Request) -> Response:
        router: Router | None = getattr(request.app.state, "router", None)
        ok = router is not None and router.healthy()
        return Response(status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        router: Router = request.app.state.router
        await asyncio.gather(*(_scrape(router, r) for r in router.pool.live()))
        return Response(generate_latest(request.app.state.registry),
                        media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        router: Router = request.app.state.router
        headers = forward_headers(request.headers)  # the replicas' API key, if they have one
        query = str(request.url.query)
        done = await asyncio.gather(*(_reset(router, r, headers, query)
                                      for r in router.pool.live()))
        return JSONResponse({"success": bool(done) and all(done)})

    @app.get("/router/replicas")
    async def replicas(request: Request) -> JSONResponse:
        router: Router = request.app.state.router
        mode: dict[str, Any] = {"mode": "colocated", "policy": config.policy}
        if config.disaggregated:
            mode = {"mode": "disaggregated", "prefill_policy": config.prefill_policy,
                    "decode_policy": config.decode_policy, "kv_push": config.kv_push}
        return JSONResponse({**mode, "replicas": [r.describe() for r in router.pool.replicas]})

    @app.get("/router/requests")
    async def requests(request: Request) -> JSONResponse:
        router: Router = request.app.state.router
        records = router.records if isinstance(router, DisaggRouter) else []
        return JSONResponse({"requests": [dataclasses.asdict(r) for r in records]})

    add_error_handlers(app, logger, "routing")
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app


async def _watch(router: Router, interval_s: float) -> None:
    """Mark dead the replicas the pool knows are gone (a process exited, a Ray actor died) or,
    for servers it does not watch, whose /health refuses the connection; route again to the
    replicas the pool brought back (a restarted Ray actor: new URL, counters kept)."""
    while True:
        await asyncio.sleep(interval_s)
        for r in await asyncio.to_thread(router.pool.recovered):
            router.replica_recovered(r)
        for r in router.pool.live():
            if router.pool.watches(r):
                reason = router.pool.failure(r)
                if reason is not None:
                    router.replica_failed(r, reason)
                continue
            try:
                await router.client.get(r.base_url + "/health", timeout=5.0)
            except httpx.ConnectError as e:
                router.replica_failed(r, f"/health: {type(e).__name__}: {e}")
            except httpx.HTTPError:
                pass  # slow is not dead


async def _cancel_on_disconnect(request: Request, task: asyncio.Future[Response]) -> None:
    """Cancel a JSON request's forwarding when its client disconnects: the replica
    connection closes and the replica aborts the request (the body is already read)."""
    while not task.done():
        message = await request.receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return
        await asyncio.sleep(0.05)


async def _scrape(router: Router, replica: Replica) -> None:
    try:
        resp = await router.client.get(replica.base_url + "/metrics", timeout=SCRAPE_TIMEOUT_S)
    except httpx.HTTPError as e:
        logger.debug("scraping replica %d failed: %s", replica.index, e)
        return
    if resp.status_code == 200:
        replica.last_metrics = resp.text


async def _reset(router: Router, replica: Replica, headers: dict[str, str],
                 query: str = "") -> bool:
    try:
        url = replica.base_url + "/reset_prefix_cache" + (f"?{query}" if query else "")
        resp = await router.client.post(url, timeout=30.0, headers=headers)
        return resp.status_code == 200 and bool(resp.json().get("success", True))
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        logger.warning("reset_prefix_cache on replica %d failed: %s", replica.index, e)
        return False
