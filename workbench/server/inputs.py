"""From a validated API request to engine `Request`s: prompts, chat template, SamplingParams.

Place in the flow: `openai_routes` -> `build_requests()` -> `generate.Generation`. Every
check here raises `APIError(400)` naming the field: prompt/messages longer than what leaves
room to generate in max_model_len, max_tokens above what fits, token ids out of the
vocabulary, sampling values the engine rejects (the engine's ValueError names the field).

Everything here runs in a worker thread (`openai_routes` calls it through
`asyncio.to_thread`), never on the event loop. Text is encoded with the fast tokenizer's Rust
`encode_batch`, which releases the interpreter lock while it works, and a text that is too
long is refused from its token count without turning millions of ids into a Python list, so
`/health` and other requests are answered while a 4 MB prompt is being tokenized. The Rust
tokenizer is only read (no truncation or padding state is set), so threads may share it; a
slow (pure Python) tokenizer is used under a lock.
"""

from __future__ import annotations

import itertools
import re
import threading
from typing import Any

from workbench.engine.llm_engine import LLMEngine
from workbench.engine.request import Request
from workbench.sampling_params import SamplingParams
from workbench.server.protocol import APIError, ChatCompletionRequest, CompletionRequest

MAX_PROMPTS = 64  # prompts in one batched /v1/completions request
_ids = itertools.count()  # makes engine request ids unique even if clients reuse x-request-id
_slow_tokenizer_lock = threading.Lock()


def encode(
    tok: Any, text: str, add_special_tokens: bool, max_model_len: int | None, where: str,
    param: str,
) -> list[int]:
    """`text`'s token ids; APIError(400) when it leaves no room to generate in max_model_len
    (None: no check here, as in the router, whose replicas check)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        with _slow_tokenizer_lock:
            return list(tok(text, add_special_tokens=add_special_tokens)["input_ids"])
    enc = backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]
    if max_model_len is not None and len(enc) >= max_model_len:
        raise too_long(where, len(enc), max_model_len, param)
    return list(enc.ids)


def too_long(where: str, num_tokens: int, max_model_len: int, param: str) -> APIError:
    return APIError(
        f"{where} has {num_tokens} tokens; to generate at least one token within "
        f"max_model_len ({max_model_len}) it must have at most {max_model_len - 1}",
        param=param,
    )


def param_of(message: str, req: Any, default: str | None) -> str | None:
    """The request field an engine ValueError names ("stop_token_ids[0] (99999) is out of
    range" -> "stop_token_ids"), else `default`."""
    m = re.match(r"[A-Za-z_]+", message)
    return m.group(0) if m and m.group(0) in type(req).model_fields else default


def completion_prompts(engine: LLMEngine, req: CompletionRequest) -> list[list[int]]:
    """`prompt` as token-id lists: a string, a list of ids, or a batch of either."""
    p = req.prompt
    batch: list[Any] = [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)
    if len(batch) > MAX_PROMPTS:
        raise APIError(
            f"prompt has {len(batch)} prompts; at most {MAX_PROMPTS} are allowed per request",
            param="prompt",
        )
    tok, mml = engine.tokenizer, engine.max_model_len
    return [
        encode(tok, x, req.add_special_tokens, mml,
               f"prompt[{i}]" if len(batch) > 1 else "prompt", "prompt")
        if isinstance(x, str) else list(x)
        for i, x in enumerate(batch)
    ]


def chat_prompt(engine: LLMEngine, req: ChatCompletionRequest) -> list[int]:
    """Render `messages` with the tokenizer's chat template (a plain one when it has none)."""
    messages: list[dict[str, str]] = []
    for i, m in enumerate(req.messages):
        if m.content is None or isinstance(m.content, str):
            text = m.content or ""
        else:
            bad = [part.type for part in m.content if part.type != "text"]
            if bad:
                raise APIError(
                    f"messages.{i}.content: only 'text' content parts are supported (got "
                    f"{bad[0]!r})", param=f"messages.{i}.content",
                )
            text = "".join(part.text or "" for part in m.content)
        messages.append({"role": m.role, "content": text})
    tok = engine.tokenizer
    if getattr(tok, "chat_template", None):
        try:
            rendered = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=req.add_generation_prompt
            )
        except Exception as e:  # noqa: BLE001 - a template error is the request's problem
            raise APIError(f"messages: the chat template failed: {e}", param="messages") from e
    else:
        rendered = default_chat_template(messages, req.add_generation_prompt, tok.bos_token)
    return encode(tok, str(rendered), req.add_special_tokens, engine.max_model_len,
                  "messages", "messages")


def default_chat_template(
    messages: list[dict[str, str]], add_generation_prompt: bool, bos: str | None
) -> str:
    """`role: content` lines, then `assistant: ` (for checkpoints without a chat template)."""
    text = (bos or "") + "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if add_generation_prompt else "")


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
