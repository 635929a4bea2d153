"""HTTP plumbing both front doors share: the request body, the error handlers, a streaming
response that always closes its generator.

    body = await read_body(request, limit)       413 past `limit` bytes, checked while reading
    data = decode_json(body)                     400 if not JSON (call it off the event loop)
    add_error_handlers(app, logger, "serving")   APIError, HTTP errors and the unexpected as
                                                 the OpenAI error body

`ClosingStreamingResponse`: Starlette leaves an async generator open when the client goes
away (even before the first byte); closing it at once runs the generator's own cleanup (the
server aborts the engine request and frees its blocks, the router closes the replica stream so
the replica aborts). `on_close()` is the hook for anything else to do afterwards.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from workbench.entrypoints.openai.protocol.errors import APIError

DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 past `limit` bytes (checked while reading)."""
    declared = request.headers.get("content-length")
    too_big = APIError(f"the request body is larger than the limit of {limit} bytes", 413)
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(body: bytes) -> Any:
    """The body as JSON; 400 if malformed."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise APIError(f"the request body is not valid JSON: {e}") from None


def valid_request_id(given: str | None) -> str | None:
    """A client's `x-request-id` when it may be echoed (printable, at most 256 chars)."""
    return given if given and len(given) <= 256 and given.isprintable() else None


def add_error_handlers(app: FastAPI, logger: logging.Logger, doing: str,
                       echo_request_id: bool = False) -> None:
    """Every error as the OpenAI error body: an APIError with its status, an HTTP error
    (404 for an unknown path, 405, ...) with its, anything else a 500 for that request only
    (logged to `logger`: "unhandled error {doing} {path}"). `echo_request_id`: the error
    response carries the client's valid x-request-id header, as a success does."""

    def respond(err: APIError, request: Request) -> JSONResponse:
        headers = {}
        rid = valid_request_id(request.headers.get("x-request-id")) if echo_request_id else None
        if rid is not None:
            headers["x-request-id"] = rid
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(exc, request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return respond(APIError(str(exc.detail), exc.status_code), request)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error %s %s", doing, request.url.path)
        return respond(APIError(f"internal error: {type(exc).__name__}: {exc}", 500), request)


class ClosingStreamingResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
            self.on_close()

    def on_close(self) -> None:
        """Called after the body generator is closed, however the response ended."""
