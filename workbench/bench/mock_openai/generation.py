"""What the mock OpenAI server answers to one request: its settings (`MockConfig`), the
request's parse into a `Generation` (token counts, how it ends, how it is sent) and the
response it becomes, in vLLM's shapes (`serving_completion.py`, `serving_chat.py`).

Place in the flow: `server.MockServer` parses each completions / chat body here
and writes the events or the body `Generation` makes. Pure functions of the request bytes.

    streamed   one `data:` event per token, {"id", "object": "text_completion" |
               "chat.completion.chunk", "created", "model", "choices": [{"index": 0, "text" |
               "delta", "logprobs", "finish_reason", ...}]}; chat opens with a role chunk
               (delta {"role": "assistant", "content": ""}); the last token's choice carries
               finish_reason; `stream_options.include_usage` adds a final chunk with
               "choices": [] and "usage" {prompt_tokens, total_tokens, completion_tokens}
               (`continuous_usage_stats`: usage in every chunk too); then `data: [DONE]`
    not        one JSON body with the same usage
    streamed

Tokens: token i (from 0) is the text " t<i>". A prompt's tokens are its token ids (a list of
ints) or its whitespace-separated words (a text prompt, the text of chat messages). The
limit (`max_tokens`; chat: `max_completion_tokens`, else `max_tokens`; else
`default_max_tokens`) is honoured exactly; with `eos_after` set the "model" emits EOS after
that many tokens (finish_reason "stop") unless the request sets `ignore_eos`. Refusals are
`OpenAIRequestError`s: 400 / 404 with vLLM's {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MockConfig:
    host: str = "127.0.0.1"  # the address to bind; 127.0.0.1 keeps the mock off the network
    port: int = 8000  # 0: any free port (MockServer.port says which)
    model: str = "mock"  # the one served model name
    token_delay_s: float = 0.0  # sleep between tokens; 0 = as fast as the loop allows
    eos_after: int | None = None  # emit EOS after this many tokens (unless ignore_eos)
    default_max_tokens: int = 16  # when a request names no limit (vLLM's completions default)
    max_model_len: int = 4096  # reported by /v1/models only

    def __post_init__(self) -> None:
        if _bad_int(self.port, 0) or self.port > 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {self.port!r}")
        if isinstance(self.token_delay_s, bool) or not isinstance(
                self.token_delay_s, int | float) or not 0 <= self.token_delay_s < 60:
            raise ValueError(f"token_delay_s must be seconds in [0, 60), got "
                             f"{self.token_delay_s!r}")
        for name in ("default_max_tokens", "max_model_len"):
            if _bad_int(getattr(self, name), 1):
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.eos_after is not None and _bad_int(self.eos_after, 1):
            raise ValueError(f"eos_after must be an integer >= 1 or None, got "
                             f"{self.eos_after!r}")
        if not self.model:
            raise ValueError("model must be a non-empty served model name")


def _bad_int(value: object, low: int) -> bool:
    return isinstance(value, bool) or not isinstance(value, int) or value < low


class OpenAIRequestError(Exception):
    """A refused request: HTTP status and vLLM's error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def body(self) -> dict[str, Any]:
        kind = "NotFoundError" if self.status == 404 else "BadRequestError"
        return {"error": {"message": str(self), "type": kind, "param": None,
                          "code": self.status}}


def _words(content: Any) -> int:
    """Tokens of a chat message's content: a string, or a list of {"type": "text"} parts."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(len(str(p.get("text", "")).split()) for p in content if isinstance(p, dict))
    return 0


@dataclass(frozen=True)
class Generation:
    """What one request gets: its token counts, how it ends and how it is sent."""

    stream: bool
    prompt_tokens: int
    num_tokens: int
    finish_reason: str  # "length" | "stop"
    include_usage: bool
    continuous_usage: bool

    @classmethod
    def parse(cls, raw: bytes, chat: bool, config: MockConfig) -> Generation:
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise OpenAIRequestError(400, f"the request body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise OpenAIRequestError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, config.model):
            raise OpenAIRequestError(404, f"The model `{body['model']}` does not exist.")
        if body.get("n", 1) != 1:
            raise OpenAIRequestError(400, f"n ({body['n']!r}) must be 1 on the mock server")
        limit = body.get("max_completion_tokens") if chat else None
        limit = body.get("max_tokens") if limit is None else limit
        limit = config.default_max_tokens if limit is None else limit
        if _bad_int(limit, 1):
            raise OpenAIRequestError(400, f"max_tokens must be an integer >= 1, got {limit!r}")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise OpenAIRequestError(400, "messages must be a non-empty list")
            prompt = sum(_words(m.get("content")) for m in msgs if isinstance(m, dict))
        else:
            p = body.get("prompt")
            if isinstance(p, list) and all(isinstance(t, int) for t in p) and p:
                prompt = len(p)
            elif isinstance(p, str):
                prompt = len(p.split())
            else:
                raise OpenAIRequestError(400, "prompt must be a string or a non-empty list of "
                                         "token ids (one prompt per request on the mock)")
        eos = config.eos_after
        n = limit if eos is None or body.get("ignore_eos") else min(limit, eos)
        stream_options = body.get("stream_options")
        opts = stream_options if isinstance(stream_options, dict) else {}
        return cls(stream=bool(body.get("stream")), prompt_tokens=prompt, num_tokens=n,
                   finish_reason="length" if n == limit else "stop",
                   include_usage=bool(opts.get("include_usage")),
                   continuous_usage=bool(opts.get("continuous_usage_stats")))

    def usage(self, completion: int) -> str:
        p = self.prompt_tokens
        return (f'{{"prompt_tokens":{p},"total_tokens":{p + completion},'
                f'"completion_tokens":{completion}}}')

    def events(self, head: dict[str, Any], chat: bool) -> Iterator[tuple[bytes, bool]]:
        """(one SSE event, is it a token) in order, [DONE] last."""
        pre = json.dumps(head, separators=(",", ":"))[:-1] + ',"choices":['
        cont = self.continuous_usage
        if chat:
            usage = f',"usage":{self.usage(0)}' if cont else ""
            yield (f'data: {pre}{{"index":0,"delta":{{"role":"assistant","content":""}},'
                   f'"logprobs":null,"finish_reason":null}}]{usage}}}\n\n').encode(), False
        last = self.num_tokens - 1
        for i in range(self.num_tokens):
            fr = f'"{self.finish_reason}"' if i == last else "null"
            if chat:
                usage = f',"usage":{self.usage(i + 1)}' if cont else ""
                text = (f'{pre}{{"index":0,"delta":{{"content":" t{i}"}},"logprobs":null,'
                        f'"finish_reason":{fr}}}]{usage}}}')
            else:
                usage = self.usage(i + 1) if cont else "null"
                text = (f'{pre}{{"index":0,"text":" t{i}","logprobs":null,"finish_reason":{fr},'
                        f'"stop_reason":null}}],"usage":{usage}}}')
            yield f"data: {text}\n\n".encode(), True
        if self.include_usage:
            yield f'data: {pre}],"usage":{self.usage(self.num_tokens)}}}\n\n'.encode(), False
        yield b"data: [DONE]\n\n", False

    def full_response(self, head: dict[str, Any], chat: bool) -> dict[str, Any]:
        text = "".join(f" t{i}" for i in range(self.num_tokens))
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=self.finish_reason, stop_reason=None)
        obj = "chat.completion" if chat else "text_completion"
        return {**head, "object": obj, "choices": [choice],
                "usage": json.loads(self.usage(self.num_tokens))}
