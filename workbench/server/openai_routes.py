"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (JSON or SSE), /v1/models.

Place in the flow: body (size-capped, read on the event loop) -> in a worker thread
(`asyncio.to_thread`): JSON decoding, parse_request, chat template, tokenization (the
protocol package, `workbench.entrypoints.openai.protocol`), inputs.build_requests ->
generate.Generation -> a JSON body, or server-sent events `data: {chunk}` ... `data: [DONE]`.
Nothing that grows with the body runs on the event loop, so /health and the other clients'
streams are served while a 4 MB prompt is prepared.

A request the engine fails (finish_reason "error": it alone, or its whole step) is a 500
`{"error": ...}` with the engine's message, or, streaming, one `data: {"error": ...}` event
and then `data: [DONE]`; the engine's other requests go on untouched.

Streaming: one chunk per engine step that released text for a choice (chat: just before a
choice's first text, a chunk with `delta.role` and empty content, as vLLM does); with
`stream_options.include_usage` a last chunk with `choices: []` and `usage`; the last chunk
before `[DONE]` carries the per-request `metrics` object (see `request_metrics.py`). With
`return_token_ids: true` every chunk's choice also has the `token_ids` it covers (a chunk is
then sent for every step, text or not). A client that disconnects mid-stream (or mid
non-streaming request) aborts its engine requests, which frees their KV blocks. The response
id is the client's `x-request-id` header when given, otherwise `cmpl-<hex>` /
`chatcmpl-<hex>`; it is echoed in the `x-request-id` response header.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from workbench.core.request import Request as EngineRequest
from workbench.engine.async_engine import AsyncEngine, AsyncEngineError
from workbench.engine.llm_engine import LLMEngine
from workbench.entrypoints.openai.protocol import responses as R
from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.http import (
    ClosingStreamingResponse,
    decode_json,
    read_body,
    valid_request_id,
)
from workbench.entrypoints.openai.protocol.json_values import MAX_ITEMS
from workbench.entrypoints.openai.protocol.prompts import chat_prompt, completion_prompts
from workbench.entrypoints.openai.protocol.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)
from workbench.entrypoints.openai.protocol.sse import DONE_EVENT, encode_event
from workbench.server import inputs, openapi
from workbench.server.generate import Delta, Generation
from workbench.server.metrics import ServerMetrics
from workbench.server.request_metrics import request_metrics

router = APIRouter()


@dataclass
class ServingState:
    engine: AsyncEngine
    model_name: str
    model_path: str
    metrics: ServerMetrics
    max_body_bytes: int
    created: int
    max_items: int = MAX_ITEMS  # longest JSON array a request may hold

    @property
    def llm_engine(self) -> LLMEngine:
        return self.engine.engine


def serving_state(request: Request) -> ServingState:
    return request.app.state.serving


def request_id(request: Request, prefix: str) -> str:
    given = valid_request_id(request.headers.get("x-request-id"))
    return given if given is not None else f"{prefix}-{uuid.uuid4().hex}"


def check_model(state: ServingState, name: str | None) -> None:
    if name is not None and name not in (state.model_name, state.model_path):
        raise APIError(f"the model {name!r} does not exist; this server serves "
                       f"{state.model_name!r}", 404, "model")


@router.get("/v1/models", **openapi.models_route())
async def show_models(request: Request) -> JSONResponse:
    s = serving_state(request)
    return JSONResponse(R.model_list(s.model_name, s.model_path,
                                     s.llm_engine.max_model_len, s.created))


@router.post("/v1/completions", **openapi.completions_route())
async def create_completion(request: Request) -> Response:
    s = serving_state(request)
    rid = request_id(request, "cmpl")
    body = await read_body(request, s.max_body_bytes)
    req, reqs = await asyncio.to_thread(_prepare_completion, s, body, rid)
    return await _serve(request, s, req, reqs, rid, chat=False)


@router.post("/v1/chat/completions", **openapi.chat_route())
async def create_chat_completion(request: Request) -> Response:
    s = serving_state(request)
    rid = request_id(request, "chatcmpl")
    body = await read_body(request, s.max_body_bytes)
    req, reqs = await asyncio.to_thread(_prepare_chat, s, body, rid)
    return await _serve(request, s, req, reqs, rid, chat=True)


# Off the event loop (a worker thread): JSON decoding, validation, templating, tokenization.
def _prepare_completion(
    s: ServingState, body: bytes, rid: str
) -> tuple[CompletionRequest, list[EngineRequest]]:
    req = parse_request(CompletionRequest, decode_json(body), s.max_items)
    check_model(s, req.model)
    prompts = completion_prompts(s.llm_engine, req)
    return req, inputs.build_requests(s.llm_engine, req, prompts, rid, "prompt",
                                      ("max_tokens", req.max_tokens))


def _prepare_chat(
    s: ServingState, body: bytes, rid: str
) -> tuple[ChatCompletionRequest, list[EngineRequest]]:
    req = parse_request(ChatCompletionRequest, decode_json(body), s.max_items)
    check_model(s, req.model)
    prompt = chat_prompt(s.llm_engine, req)
    return req, inputs.build_requests(s.llm_engine, req, [prompt], rid, "messages",
                                      req.max_tokens_param)


async def _serve(
    request: Request, s: ServingState, req: CompletionRequest | ChatCompletionRequest,
    reqs: list[EngineRequest], rid: str, chat: bool,
) -> Response:
    gen = Generation(s.engine, s.llm_engine.tokenizer, reqs, req.n, req.stop_strings,
                     req.skip_special_tokens, s.metrics)
    for r in reqs:
        s.metrics.observe_request(req.n, r.sampling_params.max_tokens)
    try:
        gen.start()
    except AsyncEngineError as e:
        raise APIError(f"the engine is not serving: {e}", 503) from None
    headers = {"x-request-id": rid}
    if req.stream:
        body = _stream(s, gen, req, rid, chat)
        return _SSEResponse(body, gen, media_type="text/event-stream", headers=headers)
    watcher = asyncio.create_task(_abort_on_disconnect(request, gen))
    try:
        async for d in gen.deltas():
            if d.seq.error is not None:
                gen.abort()  # the answer is an error: stop this request's other sequences
                raise APIError(f"the engine failed this request: {d.seq.error}", 500)
    except AsyncEngineError as e:
        raise APIError(f"the engine failed this request: {e}", 500) from None
    finally:
        watcher.cancel()
    make = R.chat_choice if chat else R.completion_choice
    ids = bool(req.return_token_ids)
    choices = [make(q.index, q.text, q.finish_reason, q.stop_reason,
                    list(q.token_ids) if ids else None) for q in gen.seqs]
    body_ = R.envelope("chat.completion" if chat else "text_completion", rid, int(time.time()),
                       s.model_name, choices, usage=_usage(gen), metrics=_metrics(gen),
                       kv_transfer_params=gen.seqs[0].kv_transfer_params if gen.single
                       else None)
    return JSONResponse(body_, headers=headers)


def _usage(gen: Generation) -> dict[str, Any]:
    return R.usage(
        sum(r.num_prompt_tokens for r in gen.requests),
        sum(len(q.token_ids) for q in gen.seqs),
        sum(max(q.num_cached_tokens, 0) for q in gen.seqs if q.index % gen.n == 0),
    )


def _metrics(gen: Generation) -> dict[str, Any] | None:
    if not gen.single:
        return None
    q = gen.seqs[0]
    return request_metrics(q.times, len(q.token_ids), q.num_cached_tokens)


async def _stream(
    s: ServingState, gen: Generation, req: CompletionRequest | ChatCompletionRequest,
    rid: str, chat: bool,
) -> AsyncIterator[str]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    created, model = int(time.time()), s.model_name
    with_ids = bool(req.return_token_ids)
    remaining = len(gen.seqs)
    announced: set[int] = set()
    try:
        async for d in gen.deltas():
            if d.seq.error is not None:  # one error event, then [DONE]; other streams go on
                gen.abort()
                yield encode_event(APIError(f"the engine failed this request: {d.seq.error}",
                                            500).body())
                break
            if not (d.text or d.finished or (with_ids and d.token_ids)):
                continue
            if chat and d.seq.index not in announced:  # vLLM: with the first output
                announced.add(d.seq.index)
                role = {"role": "assistant", "content": ""}
                first = R.chat_delta_choice(d.seq.index, role, None, None)
                yield encode_event(R.envelope(kind, rid, created, model, [first]))
            extra: dict[str, Any] = {}
            if req.continuous_usage:
                extra["usage"] = _usage(gen)
            if d.finished:
                remaining -= 1
                if remaining == 0 and not req.include_usage:
                    extra["metrics"] = _metrics(gen)
            yield encode_event(R.envelope(kind, rid, created, model,
                                          [_chunk_choice(d, chat, with_ids)], **extra))
        else:  # every sequence finished (no error)
            if req.include_usage:
                yield encode_event(R.envelope(kind, rid, created, model, [], usage=_usage(gen),
                                              metrics=_metrics(gen)))
    except AsyncEngineError as e:
        yield encode_event(APIError(f"the engine failed this request: {e}", 500).body())
    yield DONE_EVENT


def _chunk_choice(d: Delta, chat: bool, with_ids: bool) -> dict[str, Any]:
    q = d.seq
    reason = q.finish_reason if d.finished else None
    stop_reason = q.stop_reason if d.finished else None
    ids = d.token_ids if with_ids else None
    if chat:
        delta = {"content": d.text} if d.text or not d.finished else {}
        return R.chat_delta_choice(q.index, delta, reason, stop_reason, ids)
    return R.completion_choice(q.index, d.text, reason, stop_reason, ids)


async def _abort_on_disconnect(request: Request, gen: Generation) -> None:
    """Wait for the client to go away (the body is already read), then abort."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gen.abort()
            return
        await asyncio.sleep(0.05)


class _SSEResponse(ClosingStreamingResponse):
    """Closes its generator and aborts what is unfinished, so a client that goes away (even
    before the first byte) frees its blocks at once."""

    def __init__(self, content: AsyncIterator[str], gen: Generation, **kw: Any) -> None:
        super().__init__(content, **kw)
        self.gen = gen

    def on_close(self) -> None:
        self.gen.abort()
