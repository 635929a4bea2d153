"""A client request as the router needs it: validated, its prompt ids, how many choices.

Place in the flow: `app` reads the JSON body -> `routed_request()` -> the policy keys on
`route.prompt_token_ids`, and a broken stream is resumed from `prompt_token_ids` (+ the
tokens already generated). The body is validated and tokenized with the code the server uses
(the protocol package: `requests.parse_request`, `prompts`) and the replicas' tokenizer, so
the ids are exactly what a replica computes: text prompts with `add_special_tokens`, chat
messages through the chat template. A bad body is the same `APIError` (400) a replica would
answer; the body forwarded to the replica is the client's, unchanged. `app` calls this in a
worker thread, off the event loop (a 4 MB prompt takes seconds to tokenize).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.entrypoints.openai.protocol.prompts import (
    PromptTokenizer,
    chat_prompt,
    completion_prompts,
)
from workbench.entrypoints.openai.protocol.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)
from workbench.router.policies import RouteRequest

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class RoutedRequest:
    kind: str  # "completions" | "chat"
    body: dict[str, Any]  # the client's JSON body
    route: RouteRequest  # what the policy sees (the first prompt's ids, the cache salt)
    prompt_token_ids: list[int] | None  # the single prompt's ids; None for a batch
    num_choices: int  # prompts x n
    max_tokens: int | None  # the client's max_tokens (chat: max_completion_tokens first)
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    stop: list[str]
    skip_special_tokens: bool
    # disaggregated decode leg: the prefill's `kv_transfer_params`, added to the FIRST attempt
    # only (a retry, restart or resume goes without: that replica recomputes the prompt)
    kv_transfer_params: dict[str, Any] | None = None
    # disaggregated with kv_push: the decode replica the prefill pushed the KV to (its
    # attempt already counted on it); the decode leg's first attempt goes there when alive
    pushed_to: int | None = None

    @property
    def path(self) -> str:
        return ENDPOINTS[self.kind]


def routed_request(kind: str, body: Any, tokenizer: Any) -> RoutedRequest:
    """Validate `body` for endpoint `kind` and tokenize its prompt(s); APIError if invalid."""
    if kind not in ENDPOINTS:
        raise ValueError(f"kind ({kind!r}) must be one of {list(ENDPOINTS)}")
    source = PromptTokenizer(tokenizer)  # max_model_len None: the replicas check the length
    if kind == "chat":
        req: Any = parse_request(ChatCompletionRequest, body)
        prompts = [chat_prompt(source, req)]
        max_tokens = req.max_tokens_param[1]
    else:
        req = parse_request(CompletionRequest, body)
        prompts = completion_prompts(source, req)
        max_tokens = req.max_tokens
    return RoutedRequest(
        kind=kind, body=dict(body), route=RouteRequest(prompts[0], req.cache_salt),
        prompt_token_ids=prompts[0] if len(prompts) == 1 else None,
        num_choices=len(prompts) * req.n, max_tokens=max_tokens, stream=bool(req.stream),
        include_usage=req.include_usage, continuous_usage=req.continuous_usage,
        return_token_ids=bool(req.return_token_ids), stop=req.stop_strings,
        skip_special_tokens=req.skip_special_tokens,
    )
