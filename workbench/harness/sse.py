"""One streamed OpenAI response -> one RequestRecord, the way vLLM's benchmark client reads it.

Place in the flow: `http_stream.stream_completion` feeds the bytes of each response to an
`SSEByteDecoder` (the protocol's, `workbench.entrypoints.openai.protocol.sse`) and every
`data:` payload, with its arrival time (one clock read per network read), to a `StreamParser`.
Pure functions of (payloads, times): tested without a server.

Rules (vLLM `benchmarks/lib/endpoint_request_func.py`, completions and chat):
- An event with `choices` is a token chunk, even with empty text (a special token, half a
  UTF-8 character); the first one is TTFT, every later one adds one ITL gap. Exceptions:
  when the server says how many tokens an event carries (`token_ids` in the choice, or usage
  streamed per chunk with `continuous_usage_stats`), an event with no token and no text is
  not a token chunk; a chat event with only `delta.role` is not one either (`workbench serve`
  sends it before the first token; vLLM sends it together with the first token, so vLLM's
  own client and this rule agree there).
- Tokens per chunk: len(`token_ids`), else the growth of `usage.completion_tokens` when
  streamed, else 1.
- output_tokens = the last `usage.completion_tokens` (the final usage event of
  `stream_options: {include_usage: true}`); prompt_tokens = `usage.prompt_tokens` when given;
  num_cached_tokens = `usage.prompt_tokens_details.cached_tokens` when given. Without any
  usage, output_tokens = the number of token chunks.
- end_s = the last token chunk (vLLM's `latency`), not [DONE].
- Success = at least one token chunk and no error event.
- Server-side durations are read from any event that carries them, top level or in a
  `metrics` object (`workbench serve`'s last chunk, in ms: queue_time_ms,
  arrival_to_first_token_ms, prefill_time_ms, decode_time_ms, e2e_latency_ms) or a
  `server_timing` / `timings` object (seconds); see SERVER_FIELDS.
"""

from __future__ import annotations

from typing import Any

from workbench.entrypoints.openai.protocol.sse import DONE, parse_json
from workbench.harness.metrics import RequestRecord

# RequestRecord field -> (name, seconds per unit) a server may use for it in an event.
# `workbench serve` (and vLLM's per-request `metrics` object) send milliseconds; there
# `time_to_first_token_ms` counts from first scheduled, i.e. it is the prefill time.
SERVER_FIELDS: dict[str, tuple[tuple[str, float], ...]] = {
    "server_queue_s": (("server_queue_s", 1.0), ("queue_s", 1.0), ("queue_time_s", 1.0),
                       ("queue_time_ms", 1e-3)),
    "server_prefill_s": (("server_prefill_s", 1.0), ("prefill_s", 1.0),
                         ("prefill_time_ms", 1e-3), ("time_to_first_token_ms", 1e-3)),
    "server_decode_s": (("server_decode_s", 1.0), ("decode_s", 1.0), ("decode_time_ms", 1e-3)),
    "server_ttft_s": (("server_ttft_s", 1.0), ("ttft_s", 1.0),
                      ("arrival_to_first_token_ms", 1e-3)),
    "server_e2e_s": (("server_e2e_s", 1.0), ("e2e_s", 1.0), ("e2e_latency_s", 1.0),
                     ("e2e_latency_ms", 1e-3)),
    # a disaggregated decode instance's read of the prompt's KV (workbench serve)
    "server_kv_transfer_s": (("kv_transfer_ms", 1e-3),),
    "server_kv_wait_s": (("kv_transfer_wait_ms", 1e-3),),
    "server_kv_transfer_bytes": (("kv_transfer_bytes", 1.0),),
}
SERVER_CONTAINERS = ("metrics", "server_timing", "server_timings", "timings")
# every top-level key that may carry a server duration: events without one skip the search
SERVER_KEYS = frozenset({name for names in SERVER_FIELDS.values() for name, _ in names}
                        | set(SERVER_CONTAINERS))


def _text(data: str | bytes) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


def server_fields(event: dict[str, Any]) -> dict[str, float]:
    """Server-side durations carried by one event (see SERVER_FIELDS / SERVER_CONTAINERS)."""
    found: dict[str, float] = {}
    nested = [event[c] for c in SERVER_CONTAINERS if isinstance(event.get(c), dict)]
    for src in [event, *nested]:
        for field, names in SERVER_FIELDS.items():
            for name, scale in names:
                v = src.get(name)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    found.setdefault(field, float(v) * scale)
                    break
    return found


class StreamParser:
    """Applies the payloads of one response to `record` (see the module docstring).

    `info` collects what the server said besides tokens: response id, finish_reason, whether
    usage came, server-side durations, whether [DONE] came.
    """

    def __init__(self, record: RequestRecord, chat: bool = False) -> None:
        self.record, self.chat = record, chat
        self.info: dict[str, Any] = {"server": {}, "usage": False, "done": False}
        self.error: str | None = None
        self._usage_ct: int | None = None
        self._last_token_s: float | None = None

    def feed(self, data: str | bytes, now: float) -> None:
        """One `data:` payload (text, or bytes from `SSEByteDecoder`) that arrived at `now`
        (seconds, the record's clock)."""
        if data in DONE:
            self.info["done"] = True
            return
        try:
            event = parse_json(data)
        except ValueError:  # not JSON, or bytes that are not UTF-8
            self.error = f"malformed SSE data: {_text(data)[:200]!r}"
            return
        if type(event) is not dict:
            self.error = f"unexpected SSE data: {_text(data)[:200]!r}"
            return
        info = self.info
        if event.get("error") and not event.get("choices"):
            err = event["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
        if info.get("id") is None:
            info["id"] = event.get("id")
        if not SERVER_KEYS.isdisjoint(event):  # most events carry no server durations
            info["server"].update(server_fields(event))
        usage = event.get("usage")
        if type(usage) is not dict:
            usage = None
        choices = event.get("choices")
        if choices and type(choices) is list and type(choices[0]) is dict:
            self._choice(choices[0], usage, now)
        if usage is not None:
            if usage.get("completion_tokens") is not None:
                self.record.output_tokens = int(usage["completion_tokens"])
                self.info["usage"] = True
            if usage.get("prompt_tokens") is not None:
                self.record.prompt_tokens = int(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details")
            if type(details) is dict and details.get("cached_tokens") is not None:
                self.record.num_cached_tokens = int(details["cached_tokens"])

    def _choice(self, c: dict[str, Any], usage: dict[str, Any] | None, now: float) -> None:
        delta = c.get("delta") or {}
        text = delta.get("content") if self.chat else c.get("text")
        n: int | None = None  # tokens in this event, when the server says
        if isinstance(c.get("token_ids"), list):
            n = len(c["token_ids"])
        if usage is not None and usage.get("completion_tokens") is not None:
            ct = int(usage["completion_tokens"])
            n, self._usage_ct = (ct - (self._usage_ct or 0) if n is None else n), ct
        if c.get("finish_reason"):
            self.info["finish_reason"] = c["finish_reason"]
        if n is not None and n <= 0 and not text:
            return  # the server shows this event carried no token
        if n is None and self.chat and "role" in delta and not text and not c.get(
                "finish_reason"):
            return  # the chat role chunk, sent before any token by some servers
        n = 1 if n is None else n
        r = self.record
        if r.first_token_s is None:
            r.first_token_s = now
        r.chunk_times_s.append(now)
        r.chunk_tokens.append(max(n, 0))
        self._last_token_s = now

    def finish(self, now: float) -> None:
        """The stream ended at `now`: output tokens, end, success, server durations."""
        r = self.record
        if not self.info["usage"]:
            r.output_tokens = sum(r.chunk_tokens)
        fill_server(r, self.info["server"])
        r.end_s = self._last_token_s if self._last_token_s is not None else now
        r.success = self.error is None and self._last_token_s is not None
        if r.success:
            r.error = None
        else:
            r.error = self.error or "the stream carried no token (no event with choices)"


def fill_server(record: RequestRecord, fields: dict[str, float]) -> None:
    """Copy server durations; derive prefill = ttft - queue and decode = e2e - ttft."""
    for k, v in fields.items():
        setattr(record, k, v)
    q, ttft, e2e = record.server_queue_s, record.server_ttft_s, record.server_e2e_s
    if record.server_prefill_s is None and q is not None and ttft is not None:
        record.server_prefill_s = ttft - q
    if record.server_decode_s is None and ttft is not None and e2e is not None:
        record.server_decode_s = e2e - ttft
