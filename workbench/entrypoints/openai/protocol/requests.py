"""OpenAI-compatible request models (vLLM's field names and meanings) and `parse_request`.

Place in the flow: the server's routes and the router parse a JSON body into
`CompletionRequest` / `ChatCompletionRequest` (pydantic, strict types: no "5" for 5, no true
for 1; but 5.0 is the integer 5, as JSON Schema counts it); a validation failure is an
`APIError` (400) naming the field.

Before the models see it, `parse_request` walks the decoded JSON once
(`json_values.check_json_values`: finite numbers, valid Unicode, arrays at most `max_items`
long); each offence is a 400 naming the value's path (`messages.0.content`).

Supported sampling fields: temperature, top_p, top_k, n (<= MAX_N), max_tokens (default: what
fits, max_model_len - prompt length), min_tokens, stop (strings, applied by the server: the
text is cut before the stop string, finish_reason "stop", stop_reason the string),
stop_token_ids, ignore_eos, seed, skip_special_tokens, priority, cache_salt, stream,
stream_options (include_usage, continuous_usage_stats), return_token_ids. Fields that would
change the output but are not implemented (logprobs, echo, penalties, logit_bias, beam search,
tools, non-text response formats, ...) are rejected with a 400 naming them; unknown fields are
ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.json_values import MAX_ITEMS, BadValue, check_json_values

MAX_N = 16  # n above this is a 400
MAX_STOP_STRINGS = 16
# Every model refuses inf / NaN itself too, for callers that skip check_json_values.
_CONFIG = ConfigDict(extra="allow", allow_inf_nan=False)


def _integral(v: Any) -> Any:
    """JSON has one kind of number: 9.0 is the integer 9, as JSON Schema says (9.5 is not)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


# Integer fields: strict (no "9", no true) but 9.0 is 9. The bounds come before the validator
# so that the JSON schema writes them as minimum / maximum.
_AsInt = BeforeValidator(_integral)
Int = Annotated[int, _AsInt]
PositiveInt = Annotated[int, Field(ge=1), _AsInt]
NonNegativeInt = Annotated[int, Field(ge=0), _AsInt]
TopK = Annotated[int, Field(ge=-1), _AsInt]
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1), _AsInt]
NumSeqs = Annotated[int, Field(ge=1, le=MAX_N), _AsInt]


class StreamOptions(BaseModel):
    model_config = _CONFIG

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat (OpenAI's plus vLLM's extra sampling params)."""

    model_config = _CONFIG

    model: str | None = None
    n: NumSeqs = 1
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    min_tokens: NonNegativeInt = 0
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    priority: Int = 0
    cache_salt: str | None = None
    return_token_ids: bool | None = None
    user: str | None = None
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's: read by the KV connector
    # accepted only at their neutral value (see UNSUPPORTED)
    logprobs: Any = None
    echo: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    min_p: Any = None
    use_beam_search: Any = None
    response_format: Any = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> list[str] | None:
        stops = [v] if isinstance(v, str) else v
        if stops is None:
            return None
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise ValueError(
                f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
                "non-empty strings"
            )
        return stops

    @field_validator("cache_salt")
    @classmethod
    def _check_salt(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("must be a non-empty string when given")
        return v

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        so = self.stream_options
        return bool(self.stream and so and so.include_usage and so.continuous_usage_stats)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions. `prompt`: a string, a list of token ids, or a list of those."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: PositiveInt | None = None
    add_special_tokens: bool = True
    suffix: Any = None
    best_of: PositiveInt | None = Field(None, description="must equal n when given")
    prompt_logprobs: Any = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):  # token ids: 7.0 is 7, as in every integer field
            v = [[_integral(t) for t in p] if isinstance(p, list) else _integral(p) for p in v]
        ok = isinstance(v, str) or (isinstance(v, list) and v and (
            all(isinstance(p, str) for p in v) or _is_ids(v)
            or all(isinstance(p, list) and p and _is_ids(p) for p in v)
        ))
        if not ok:
            raise ValueError(
                "must be a non-empty string, a non-empty list of token ids (ints), or a "
                "non-empty list of those"
            )
        return v


class ContentPart(BaseModel):
    model_config = _CONFIG

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _CONFIG

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions; the prompt is the tokenizer's chat template over messages."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = False  # the chat template adds its own special tokens
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None

    @property
    def max_tokens_param(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


# field -> its neutral values; anything else is a 400 naming the field.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False), "echo": (None, False), "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}), "min_p": (None, 0, 0.0), "use_beam_search": (None, False),
    "suffix": (None, ""), "prompt_logprobs": (None,), "top_logprobs": (None, 0),
    "tools": (None, []), "tool_choice": (None, "none", "auto"), "functions": (None, []),
}


def _is_ids(v: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
    """True when `value` is one of `allowed`, as JSON compares them: 0 and 0.0 are one
    number, false is not 0."""
    return any(value == a and _kind(value) == _kind(a) for a in allowed)


def _kind(v: Any) -> str:
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__


def parse_request(cls: type[_SamplingFields], data: Any, max_items: int = MAX_ITEMS) -> Any:
    """Validate a decoded JSON body; raise APIError(400) naming the first bad field."""
    if not isinstance(data, dict):
        raise APIError(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        check_json_values(data, max_items)
    except BadValue as e:
        raise APIError(str(e), param=e.param) from None
    try:
        req = cls.model_validate(data, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [str(p) for p in err["loc"] if not _is_type_tag(p)]
        param = ".".join(loc) or None
        msg = str(err["msg"]).removeprefix("Value error, ")
        got = "" if err["type"] == "missing" else f" (got {_short(err.get('input'))})"
        raise APIError(f"{param}: {msg}{got}", param=param) from None
    fields = type(req).model_fields
    for name, allowed in UNSUPPORTED.items():
        if name in fields and not _neutral(getattr(req, name), allowed):
            raise APIError(f"{name} is not supported by this server; leave it unset", param=name)
    rf = req.response_format
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise APIError("response_format: only {'type': 'text'} is supported",
                       param="response_format")
    best_of = getattr(req, "best_of", None)
    if best_of is not None and best_of != req.n:
        raise APIError(f"best_of ({best_of}) must equal n ({req.n}) or be unset", param="best_of")
    if req.stream_options is not None and not req.stream:
        raise APIError("stream_options is only allowed with stream=true", param="stream_options")
    return req


_TYPE_TAGS = ("str", "int", "float", "bool")


def _is_type_tag(p: Any) -> bool:
    """pydantic puts union member names ('str', 'list[int]') in loc; they are not fields."""
    return isinstance(p, str) and ("[" in p or p in _TYPE_TAGS)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."
