"""Response bodies in OpenAI's shapes: dict builders for what is sent, pydantic models for the
OpenAPI document.

Place in the flow: the server's routes fill the builders from the engine's outputs; the
router rebuilds chunks with them when it resumes a broken stream. Every body is a plain dict
(serialized as is, with `sse.encode_event` when streamed); the models below only describe
them (`/openapi.json`, tests/server/test_schemathesis.py checks the answers against it).

    envelope(kind, id, created, model, choices, usage=..., metrics=...)
      kind: text_completion | chat.completion | chat.completion.chunk
    choices: completion_choice ({"text"}), chat_choice ({"message"}), chat_delta_choice
      ({"delta"}: a stream chunk's), each with index, logprobs (null), finish_reason,
      stop_reason and, with return_token_ids, token_ids
    usage(prompt_tokens, completion_tokens, cached_tokens)
    model_list(name, root, max_model_len, created)   GET /v1/models

The per-request `metrics` object (`RequestMetrics`, vLLM's per-request metrics) is computed by
the server from the engine's timestamps (`workbench.server.request_metrics`); `null` when a
request has more than one sequence.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

# --------------------------------------------------------------------------- builders


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": max(cached_tokens, 0)},
    }


def _choice(
    index: int, body: dict[str, Any], finish_reason: str | None,
    stop_reason: int | str | None, token_ids: list[int] | None,
) -> dict[str, Any]:
    """One choice: `body` ({"text"} / {"message"} / {"delta"}) plus the common fields."""
    choice: dict[str, Any] = {"index": index, **body, "logprobs": None,
                              "finish_reason": finish_reason, "stop_reason": stop_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def completion_choice(
    index: int, text: str, finish_reason: str | None, stop_reason: int | str | None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    return _choice(index, {"text": text}, finish_reason, stop_reason, token_ids)


def chat_choice(
    index: int, text: str, finish_reason: str | None, stop_reason: int | str | None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    body = {"message": {"role": "assistant", "content": text}}
    return _choice(index, body, finish_reason, stop_reason, token_ids)


def chat_delta_choice(
    index: int, delta: dict[str, Any], finish_reason: str | None,
    stop_reason: int | str | None, token_ids: list[int] | None = None,
) -> dict[str, Any]:
    return _choice(index, {"delta": delta}, finish_reason, stop_reason, token_ids)


def envelope(
    kind: str, rid: str, created: int, model: str, choices: list[dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    """kind: text_completion | chat.completion | chat.completion.chunk. `extra` (usage,
    metrics, kv_transfer_params) is added when not None; `metrics` always, null included."""
    body: dict[str, Any] = {
        "id": rid, "object": kind, "created": created, "model": model, "choices": choices,
    }
    body.update({k: v for k, v in extra.items() if v is not None or k == "metrics"})
    return body


def model_list(name: str, root: str, max_model_len: int, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{
        "id": name, "object": "model", "created": created, "owned_by": "workbench",
        "root": root, "parent": None, "max_model_len": max_model_len, "permission": [],
    }]}


# --------------------------------------------------------------------------- models


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prefix-cache hit tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class RequestMetrics(BaseModel):
    """Per-request timings (responses.py); null when the request has more than one sequence."""

    queue_time_ms: float | None
    time_to_first_token_ms: float | None
    generation_time_ms: float | None
    mean_itl_ms: float | None
    tokens_per_second: float | None
    arrival_to_first_token_ms: float | None
    prefill_time_ms: float | None
    decode_time_ms: float | None
    e2e_latency_ms: float | None
    num_output_tokens: int
    num_cached_tokens: int
    # a decode instance that read the prompt's KV from a prefill instance (absent otherwise)
    kv_transfer_bytes: int | None = None
    kv_transfer_ms: float | None = None
    kv_transfer_wait_ms: float | None = None


class _Choice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    logprobs: None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: list[int] | None = None  # present with return_token_ids: true


class CompletionChoice(_Choice):
    text: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Choice):
    message: AssistantMessage


class _Envelope(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage
    metrics: RequestMetrics | None
    # a prefill instance's handshake for the decode instance (vLLM's; absent otherwise)
    kv_transfer_params: dict[str, Any] | None = None


class CompletionResponse(_Envelope):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class ChatCompletionResponse(_Envelope):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: None
    max_model_len: int
    permission: list[Any]


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
