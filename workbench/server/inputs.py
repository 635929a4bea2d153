"""From a validated API request to engine `Request`s: SamplingParams and the checks that need
the engine.

Place in the flow: `openai_routes` -> the prompt's token ids
(`workbench.entrypoints.openai.protocol.prompts`) -> `build_requests()` ->
`generate.Generation`. Every check here raises `APIError(400)` naming the field: a prompt
longer than what leaves room to generate in max_model_len, max_tokens above what fits, token
ids out of the vocabulary, sampling values the engine rejects (the engine's ValueError names
the field). Runs in a worker thread (`openai_routes` calls it through `asyncio.to_thread`).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from workbench.core.request import Request
from workbench.engine.llm_engine import LLMEngine
from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.prompts import too_long
from workbench.entrypoints.openai.protocol.requests import (
    ChatCompletionRequest,
    CompletionRequest,
)
from workbench.sampling_params import SamplingParams

_ids = itertools.count()  # makes engine request ids unique even if clients reuse x-request-id


def param_of(message: str, req: Any, default: str | None) -> str | None:
    """The request field an engine ValueError names ("stop_token_ids[0] (99999) is out of
    range" -> "stop_token_ids"), else `default`."""
    m = re.match(r"[A-Za-z_]+", message)
    return m.group(0) if m and m.group(0) in type(req).model_fields else default


def sampling_params(
    req: CompletionRequest | ChatCompletionRequest, max_tokens: int | None
) -> SamplingParams:
    try:
        return SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=0 if req.top_k is None else req.top_k,
            min_tokens=req.min_tokens,
            max_tokens=max_tokens,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            skip_special_tokens=req.skip_special_tokens,
            extra_args=({"kv_transfer_params": req.kv_transfer_params}
                        if req.kv_transfer_params is not None else None),
        )
    except ValueError as e:
        raise APIError(str(e), param=param_of(str(e), req, None)) from None


def build_requests(
    engine: LLMEngine, req: CompletionRequest | ChatCompletionRequest,
    prompts: list[list[int]], request_id: str, prompt_param: str,
    max_tokens_param: tuple[str, int | None],
) -> list[Request]:
    """Validate every prompt against max_model_len and max_tokens, then make Requests."""
    mml = engine.max_model_len
    name, max_tokens = max_tokens_param
    for i, ids in enumerate(prompts):
        where = f"{prompt_param}[{i}]" if len(prompts) > 1 else prompt_param
        if not ids:
            raise APIError(f"{where} is empty; at least one token is required",
                           param=prompt_param)
        if len(ids) >= mml:
            raise too_long(where, len(ids), mml, prompt_param)
        if max_tokens is not None and len(ids) + max_tokens > mml:
            raise APIError(
                f"{name} ({max_tokens}) is more than fits: {where} has {len(ids)} tokens and "
                f"max_model_len is {mml}, so {name} must be at most {mml - len(ids)}",
                param=name,
            )
        bad = [t for t in ids if not 0 <= t < engine.vocab_size]
        if bad:
            raise APIError(
                f"{where}: token id {bad[0]} is out of range; allowed 0..{engine.vocab_size - 1}",
                param=prompt_param,
            )
    out = []
    for i, ids in enumerate(prompts):
        params = sampling_params(req, max_tokens)  # one per request: the engine may replace it
        try:
            out.append(engine.make_request(
                ids, params, request_id=f"{request_id}-{i}-{next(_ids)}",
                priority=req.priority, cache_salt=req.cache_salt,
            ))
        except ValueError as e:
            raise APIError(str(e), param=param_of(str(e), req, prompt_param)) from None
    return out
