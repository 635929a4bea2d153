"""A request's prompt(s) as token ids: tokenization and the chat template (vLLM's
`entrypoints/chat_utils.py` and renderer).

Place in the flow: the server (`workbench.server.inputs`) and the router (`router.prompts`)
both turn a parsed `CompletionRequest` / `ChatCompletionRequest` into token ids here, so the
router keys its routing on exactly the ids a replica computes. Every check raises
`APIError(400)` naming the field: a batch of more than MAX_PROMPTS prompts, a prompt or
messages longer than what leaves room to generate in max_model_len (None: not checked here,
as in the router, whose replicas check), a content part that is not text, a failing chat
template.

Runs in a worker thread (the server and the router call it through `asyncio.to_thread`), never
on the event loop. Text is encoded with the fast tokenizer's Rust `encode_batch`, which
releases the interpreter lock while it works, and a text that is too long is refused from its
token count without turning millions of ids into a Python list, so `/health` and other
requests are answered while a 4 MB prompt is being tokenized. The Rust tokenizer is only read
(no truncation or padding state is set), so threads may share it; a slow (pure Python)
tokenizer is used under a lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.requests import (
    ChatCompletionRequest,
    CompletionRequest,
)

MAX_PROMPTS = 64  # prompts in one batched /v1/completions request
_slow_tokenizer_lock = threading.Lock()


class TokenizerSource(Protocol):
    """What the prompt functions read: the server's `LLMEngine` has both; the router gives a
    `PromptTokenizer`."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def max_model_len(self) -> int | None: ...


@dataclass(frozen=True)
class PromptTokenizer:
    """A tokenizer without an engine (the router's: the replicas' tokenizer); `max_model_len`
    None leaves the length check to whoever serves the request."""

    tokenizer: Any
    max_model_len: int | None = None


def encode(
    tok: Any, text: str, add_special_tokens: bool, max_model_len: int | None, where: str,
    param: str,
) -> list[int]:
    """`text`'s token ids; APIError(400) when it leaves no room to generate in max_model_len
    (None: no check here)."""
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


def completion_prompts(source: TokenizerSource, req: CompletionRequest) -> list[list[int]]:
    """`prompt` as token-id lists: a string, a list of ids, or a batch of either."""
    p = req.prompt
    batch: list[Any] = [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)
    if len(batch) > MAX_PROMPTS:
        raise APIError(
            f"prompt has {len(batch)} prompts; at most {MAX_PROMPTS} are allowed per request",
            param="prompt",
        )
    tok, mml = source.tokenizer, source.max_model_len
    return [
        encode(tok, x, req.add_special_tokens, mml,
               f"prompt[{i}]" if len(batch) > 1 else "prompt", "prompt")
        if isinstance(x, str) else list(x)
        for i, x in enumerate(batch)
    ]


def chat_prompt(source: TokenizerSource, req: ChatCompletionRequest) -> list[int]:
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
    tok = source.tokenizer
    if getattr(tok, "chat_template", None):
        try:
            rendered = tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=req.add_generation_prompt
            )
        except Exception as e:  # noqa: BLE001 - a template error is the request's problem
            raise APIError(f"messages: the chat template failed: {e}", param="messages") from e
    else:
        rendered = default_chat_template(messages, req.add_generation_prompt, tok.bos_token)
    return encode(tok, str(rendered), req.add_special_tokens, source.max_model_len,
                  "messages", "messages")


def default_chat_template(
    messages: list[dict[str, str]], add_generation_prompt: bool, bos: str | None
) -> str:
    """`role: content` lines, then `assistant: ` (for checkpoints without a chat template)."""
    text = (bos or "") + "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if add_generation_prompt else "")
