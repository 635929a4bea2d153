"""One client stream assembled from one or more replica streams (pure: no I/O, tested alone).

Place in the flow: `forward.Router` opens the replica stream with `first_request()` (the
client's body plus `return_token_ids: true`, so the router sees every generated token),
passes each SSE payload to `feed()` and sends what it returns to the client. When the
replica's connection breaks or its stream ends before `[DONE]`, it asks `resume()`:

    nothing sent to the client yet     -> the same request again, from scratch ("restart";
                                          without a disaggregated prefill's kv_transfer_params)
    one choice, tokens delivered       -> a continuation ("resume") on /v1/completions:
        prompt     = prompt ids + every token generated so far
        max_tokens = the client's max_tokens - generated (omitted if the client omitted it)
        min_tokens = the client's min_tokens - generated; same sampling fields otherwise
    the choice already finished        -> the missing tail ([DONE], usage) made here
    several choices (n > 1, a batch)   -> an error event: such a stream is not resumed

Resumed chunks are rebuilt in the client's shape (text or chat delta) under the original
response id. Their text is NOT the new replica's: the router decodes all generated ids and
sends what lies beyond the text already sent (held back while it ends in an incomplete UTF-8
character), and applies the client's stop strings itself (the continuation is sent without
them: a stop string may straddle the break). So the concatenated text equals a direct
request's for the same tokens. Greedy output is identical; a sampled one is not (the new
replica cannot replay the dead one's random stream). Usage counts the original prompt and
every generated token; the per-request `metrics` object is the last replica's (it times only
the continuation), with `num_output_tokens` the total.

Without `return_token_ids` from the client, `token_ids` are removed from every chunk and the
chunks the server would not have sent (no text, no finish, not the chat role) are dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from workbench.entrypoints.openai.protocol import responses as R
from workbench.entrypoints.openai.protocol.detokenizer import StopStringChecker
from workbench.entrypoints.openai.protocol.errors import APIError
from workbench.entrypoints.openai.protocol.sse import DONE_EVENT, encode_event
from workbench.router.prompts import RoutedRequest

# Fields copied from the client's body into a continuation (sampling and request options).
CONTINUATION_FIELDS = ("model", "temperature", "top_p", "top_k", "seed", "stop_token_ids",
                       "ignore_eos", "skip_special_tokens", "priority", "cache_salt", "user")


@dataclass(frozen=True)
class Continuation:
    """The request to send next: `path` (/v1/...) and JSON `body`; `restart` when it is the
    client's own request again."""

    path: str
    body: dict[str, Any]
    restart: bool


class StreamRelay:
    def __init__(self, req: RoutedRequest, tokenizer: Any) -> None:
        self.req = req
        self.tokenizer = tokenizer
        self.chat = req.kind == "chat"
        self.kind = "chat.completion.chunk" if self.chat else "text_completion"
        self.events_sent = 0  # chunks forwarded to the client
        self.done = False  # [DONE] (or the final events) sent; stop reading
        self.failed = False  # ended with an error event: the stream could not be completed
        self.resumes = 0  # continuations started
        self.restarts = 0
        self._reset()

    def _reset(self) -> None:
        self.generated: dict[int, list[int]] = {}  # choice index -> token ids so far
        self.text_sent: dict[int, str] = {}
        self.finished: set[int] = set()
        self.envelope: tuple[str, int, str] | None = None  # (id, created, model)
        self.resumed = False
        self._pending: dict[str, Any] | None = None  # a resumed finish chunk awaiting usage
        self._usage_sent = False
        self._decoded_upto = 0
        self._stops = StopStringChecker(self.req.stop)

    # ---------------------------------------------------------------- requests
    def first_request(self) -> Continuation:
        """The client's body asking for token ids; on the first attempt (not a restart) plus
        the disaggregated prefill's `kv_transfer_params`, when there are some."""
        body = {**self.req.body, "return_token_ids": True}
        if self.req.kv_transfer_params is not None and self.restarts == 0:
            body["kv_transfer_params"] = self.req.kv_transfer_params
        return Continuation(self.req.path, body, True)

    def resume(self) -> Continuation | list[str]:
        """What to do after the current replica stream broke: a request to send, or the final
        events for the client (the stream then ends)."""
        if self.done:
            return []
        if self.events_sent == 0:  # the client saw nothing: start over, transparently
            self._reset()
            self.restarts += 1
            return self.first_request()
        if self.req.num_choices != 1 or self.req.prompt_token_ids is None:
            return self.error_events("the replica serving this stream failed after it had "
                                     "sent tokens; a stream of several choices is not resumed")
        if 0 in self.finished:
            return self._final_events(None, usage=self._usage(None), metrics=None)
        generated = self.generated.setdefault(0, [])
        remaining = None
        if self.req.max_tokens is not None:
            remaining = self.req.max_tokens - len(generated)
            if remaining < 1:
                return self._final_events(self._choice("", "length", None, []),
                                          usage=self._usage(None), metrics=None)
        body: dict[str, Any] = {k: self.req.body[k] for k in CONTINUATION_FIELDS
                                if k in self.req.body}
        body.update(prompt=[*self.req.prompt_token_ids, *generated], stream=True,
                    return_token_ids=True,
                    stream_options={"include_usage": True,
                                    "continuous_usage_stats": self.req.continuous_usage})
        if remaining is not None:
            body["max_tokens"] = remaining
        min_tokens = int(self.req.body.get("min_tokens") or 0) - len(generated)
        if min_tokens > 0:
            body["min_tokens"] = min_tokens
        self.resumed = True
        self.resumes += 1
        self._pending = None
        self._stops = StopStringChecker(self.req.stop)
        self._decoded_upto = len(self.text_sent.get(0, ""))
        return Continuation("/v1/completions", body, False)

    # ---------------------------------------------------------------- events
    def feed(self, payload: str) -> list[str]:
        """One `data:` payload of the replica stream -> the SSE events for the client."""
        if self.done:
            return []
        if payload == "[DONE]":
            if self._pending is not None:  # a resumed stream whose usage chunk never came
                return self._final_events(None, usage=self._usage(None), metrics=None)
            self.done = True
            return [DONE_EVENT]
        obj = json.loads(payload)
        if not isinstance(obj, dict) or "choices" not in obj:  # an error event: pass it on
            return self._sent([encode_event(obj)])
        if self.envelope is None and "id" in obj:
            self.envelope = (str(obj["id"]), int(obj.get("created") or 0), str(obj.get("model")))
        return self._feed_resumed(obj) if self.resumed else self._feed_direct(obj)

    def error_events(self, message: str, status: int = 502) -> list[str]:
        """An error event and [DONE]: how a stream that cannot be completed ends."""
        self.done = self.failed = True
        return [encode_event(APIError(message, status).body()), DONE_EVENT]

    def _sent(self, events: list[str]) -> list[str]:
        self.events_sent += len(events)
        return events

    def _feed_direct(self, obj: dict[str, Any]) -> list[str]:
        keep = not obj["choices"]  # the usage chunk
        self._usage_sent = self._usage_sent or keep
        for ch in obj["choices"]:
            i = int(ch.get("index", 0))
            if self.req.return_token_ids:
                ids = list(ch.get("token_ids") or [])
            else:
                ids = list(ch.pop("token_ids", None) or [])
            self.generated.setdefault(i, []).extend(ids)
            delta = ch.get("delta") or {}
            text = (delta.get("content") if self.chat else ch.get("text")) or ""
            self.text_sent[i] = self.text_sent.get(i, "") + text
            if ch.get("finish_reason") is not None:
                self.finished.add(i)
            keep = keep or bool(text) or ch.get("finish_reason") is not None or (
                "role" in delta) or (self.req.return_token_ids and bool(ids))
        return self._sent([encode_event(obj)]) if keep else []

    def _feed_resumed(self, obj: dict[str, Any]) -> list[str]:
        if not obj["choices"]:  # the continuation's usage chunk: the end is near
            usage, metrics = self._usage(obj.get("usage")), obj.get("metrics")
            if isinstance(metrics, dict):
                metrics = {**metrics, "num_output_tokens": len(self.generated[0])}
            pending, self._pending = self._pending, None
            if pending is None:
                return []
            if self.req.include_usage:
                self._usage_sent = True
                last = self._envelope([], usage=usage, metrics=metrics)
                return self._sent([encode_event(pending), encode_event(last)])
            return self._sent([encode_event({**pending, "metrics": metrics})])
        ch = obj["choices"][0]
        ids = list(ch.get("token_ids") or [])
        self.generated[0].extend(ids)
        reason = ch.get("finish_reason")
        text, hit = self._release_text(final=reason is not None)
        if hit is not None:  # a stop string: finish here, the caller closes the replica
            self.finished.add(0)
            return self._final_events(self._choice(text, "stop", hit, ids),
                                      usage=self._usage(None), metrics=None)
        extra = {"usage": self._usage(obj.get("usage"))} if self.req.continuous_usage else {}
        if reason is not None:
            self.finished.add(0)
            self._pending = self._envelope([self._choice(text, reason, ch.get("stop_reason"),
                                                         ids)], **extra)
            return []
        if not (text or (self.req.return_token_ids and ids)):
            return []
        chunk = self._envelope([self._choice(text, None, None, ids)], **extra)
        return self._sent([encode_event(chunk)])

    def _release_text(self, final: bool) -> tuple[str, str | None]:
        """The text of all generated ids beyond what was decoded before, through the stop
        strings; nothing while the decode ends in an incomplete character (unless final)."""
        full = self.tokenizer.decode(self.generated[0],
                                     skip_special_tokens=self.req.skip_special_tokens)
        new = ""
        if final or not full.endswith("\ufffd"):
            new = full[self._decoded_upto:]
            self._decoded_upto += len(new)
        text, hit = self._stops.feed(new, final=final)
        self.text_sent[0] = self.text_sent.get(0, "") + text
        return text, hit

    def _choice(self, text: str, reason: str | None, stop_reason: int | str | None,
                ids: list[int]) -> dict[str, Any]:
        tids = ids if self.req.return_token_ids else None
        if self.chat:
            delta = {"content": text} if text or reason is None else {}
            return R.chat_delta_choice(0, delta, reason, stop_reason, tids)
        return R.completion_choice(0, text, reason, stop_reason, tids)

    def _envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        rid, created, model = self.envelope or ("cmpl-router", 0, str(self.req.body.get("model")))
        return R.envelope(self.kind, rid, created, model, choices, **extra)

    def _usage(self, upstream: dict[str, Any] | None) -> dict[str, Any]:
        prompt = len(self.req.prompt_token_ids or [])
        cached = ((upstream or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return R.usage(prompt, len(self.generated.get(0, [])), min(int(cached or 0), prompt))

    def _final_events(self, choice: dict[str, Any] | None, usage: dict[str, Any],
                      metrics: dict[str, Any] | None) -> list[str]:
        """Finish the stream here: the finish chunk (if any), usage if asked, [DONE]."""
        out = []
        if self._pending is not None:
            out.append(encode_event(self._pending))
            self._pending = None
        if choice is not None:
            last = {} if self.req.include_usage else {"metrics": metrics}
            out.append(encode_event(self._envelope([choice], **last)))
        if self.req.include_usage and not self._usage_sent:
            out.append(encode_event(self._envelope([], usage=usage, metrics=metrics)))
            self._usage_sent = True
        self.done = True
        return [*self._sent(out), DONE_EVENT]
