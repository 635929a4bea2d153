"""The OpenAPI document at /openapi.json: request bodies, every status and its body.

Place in the flow: the routes parse their bodies themselves (`parse_request`: a size cap,
strict types, errors naming the field), so FastAPI cannot see the request models;
`*_route()` give each route decorator its `responses` and `openapi_extra`, and `install()`
adds the request models to the document's components. The OpenAI models (requests, responses,
the error) are the protocol package's (`workbench.entrypoints.openai.protocol`); the models
below describe this server's own routes (/health, /reset_prefix_cache, /kv_transfer_info).
tests/server/test_schemathesis.py fuzzes the server from this document and checks the
answers against it.

The schema is exact where JSON Schema can say it: types, ranges, the fields refused unless
neutral (`logprobs`: null or false, `presence_penalty`: null or 0, ...). What depends on the
model (a prompt's token count against max_model_len, token ids against the vocabulary) or on
two fields together (min_tokens <= max_tokens, stream_options needs stream) is checked by the
server with a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from workbench.entrypoints.openai.protocol.auth import OPEN_PATHS
from workbench.entrypoints.openai.protocol.errors import ErrorResponse
from workbench.entrypoints.openai.protocol.prompts import MAX_PROMPTS
from workbench.entrypoints.openai.protocol.requests import (
    MAX_STOP_STRINGS,
    UNSUPPORTED,
    ChatCompletionRequest,
    CompletionRequest,
)
from workbench.entrypoints.openai.protocol.responses import (
    ChatCompletionResponse,
    CompletionResponse,
    ModelList,
)

REF = "#/components/schemas/{model}"


class Health(BaseModel):
    """`status`: ready (200), or starting | failed | stopped (503) with the `reason`."""

    status: Literal["ready", "starting", "failed", "stopped"]
    reason: str | None = None
    phase: str | None = None  # while starting: engine | kernels | warm-up
    elapsed_s: float | None = None  # since start-up began


class ResetResult(BaseModel):
    success: bool  # false while requests hold blocks


class KVTransferInfo(BaseModel):
    kv_connector: str
    kv_role: str
    engine_id: str
    side_channel_host: str
    side_channel_port: int
    layerwise: bool  # this instance pushes its prefills' KV when told where


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    why = {400: "Bad request: the message and `param` name the field",
           401: "Missing or wrong API key", 404: "Unknown model", 413: "Body too large",
           500: "The engine failed this request (other requests are unaffected)",
           503: "Warming up, or the engine loop is not running"}
    return {c: {"model": ErrorResponse, "description": why[c]} for c in codes}


# Before OpenAPI 3.2 the `schema` of text/event-stream describes one event.
_SSE = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"const": "message"}},
    "description": "`data: {chunk}` (or one `data: {\"error\": ...}`), then `data: [DONE]`",
}}}
_REQUEST_ID = [{"name": "x-request-id", "in": "header", "required": False,
                "schema": {"type": "string"},
                "description": "the response id (echoed) when printable and <= 256 chars"}]


def _body(model: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model)}}}},
        "parameters": _REQUEST_ID}


def completions_route() -> dict[str, Any]:
    return {"responses": {200: {"model": CompletionResponse, "content": _SSE,
                                "description": "JSON, or server-sent events with stream"},
                          **_errors(400, 401, 404, 413, 500, 503)},
            "openapi_extra": _body("CompletionRequest")}


def chat_route() -> dict[str, Any]:
    return {"responses": {200: {"model": ChatCompletionResponse, "content": _SSE,
                                "description": "JSON, or server-sent events with stream"},
                          **_errors(400, 401, 404, 413, 500, 503)},
            "openapi_extra": _body("ChatCompletionRequest")}


def models_route() -> dict[str, Any]:
    return {"responses": {200: {"model": ModelList}, **_errors(401, 503)}}


def health_route() -> dict[str, Any]:
    return {"responses": {200: {"model": Health}, 503: {"model": Health,
                                                          "description": "Not ready"}}}


def metrics_route() -> dict[str, Any]:
    return {"responses": {200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                "description": "Prometheus text format"}, **_errors(503)}}


def kv_transfer_info_route() -> dict[str, Any]:
    return {"responses": {200: {"model": KVTransferInfo}, **_errors(401, 503),
                          404: {"model": ErrorResponse,
                                "description": "No KV connector with a side channel"}}}


def reset_route() -> dict[str, Any]:
    return {"responses": {200: {"model": ResetResult}, **_errors(401, 503)}}


def request_schemas() -> dict[str, Any]:
    """The request models (and what they reference) as OpenAPI components."""
    _, top = models_json_schema(
        [(CompletionRequest, "validation"), (ChatCompletionRequest, "validation")],
        ref_template=REF,
    )
    defs: dict[str, Any] = top["$defs"]
    defs["ContentPart"]["properties"]["type"] = {"const": "text", "title": "Type"}
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        props = defs[name]["properties"]
        for field, allowed in UNSUPPORTED.items():
            if field in props:
                enum = [a for a in allowed if not isinstance(a, float)]  # 0.0 == 0 in JSON
                props[field] = {"enum": enum, "default": None,
                                "description": "not supported: only its neutral value"}
        nonempty = {"type": "string", "minLength": 1}
        props["stop"] = {"anyOf": [nonempty, {"type": "array", "items": nonempty,
                                              "maxItems": MAX_STOP_STRINGS}, {"type": "null"}],
                         "default": None}
        props["cache_salt"] = {"anyOf": [nonempty, {"type": "null"}], "default": None}
        ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
        props["stop_token_ids"] = {"anyOf": [{**ids, "minItems": 0}, {"type": "null"}],
                                   "default": None}
        if "prompt" in props:
            props["prompt"] = {"anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1,
                 "maxItems": MAX_PROMPTS},
                ids,
                {"type": "array", "items": ids, "minItems": 1, "maxItems": MAX_PROMPTS},
            ], "description": "a string, token ids, or a batch of either"}
        props["response_format"] = {"anyOf": [{"type": "null"}, {
            "type": "object", "properties": {"type": {"const": "text"}}, "required": ["type"]}],
            "default": None}
    return defs


def install(app: FastAPI, api_key: bool) -> None:
    """Serve /openapi.json with the request models and, with an API key, bearer security on
    every route but /health and /metrics."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                              description=__doc__.split("\n\n")[0])
            comps = doc.setdefault("components", {})
            comps.setdefault("schemas", {}).update(request_schemas())
            if api_key:
                comps["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
                for path, ops in doc["paths"].items():
                    if path not in OPEN_PATHS:
                        for op in ops.values():
                            op["security"] = [{"bearer": []}]
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override

