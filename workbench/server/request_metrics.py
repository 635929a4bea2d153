"""The per-request `metrics` object of a response (its shape: `RequestMetrics` in
`workbench.entrypoints.openai.protocol.responses`, which builds the rest of the body).

Place in the flow: `openai_routes` computes it from a finished `generate.SeqOutput`'s engine
timestamps. It follows vLLM's `--enable-per-request-metrics` feature (field names and meanings
from vLLM's "Per-Request Metrics" docs; always on here). It is attached to the
non-streaming response and to the LAST chunk of a stream (the usage chunk when
`stream_options.include_usage` is set, otherwise the last finish chunk). Like vLLM it is
`null` when the request has more than one sequence (n > 1 or a batch of prompts). Engine
timestamps (time.perf_counter) give, in milliseconds:

    queue_time_ms           arrival -> first scheduled                    (vLLM's name)
    time_to_first_token_ms  first scheduled -> first token                (vLLM's definition:
                            "from when the request was scheduled"; = prefill_time_ms)
    generation_time_ms      first token -> last token                     (vLLM's name)
    mean_itl_ms             generation_time_ms / (tokens - 1); null for 1 token
    tokens_per_second       tokens / (first scheduled -> last token)
    -- workbench extras, named so they cannot be confused --
    arrival_to_first_token_ms  arrival -> first token (what vllm:time_to_first_token_seconds
                            observes; = queue_time_ms + prefill_time_ms)
    prefill_time_ms         first scheduled -> first token
    decode_time_ms          first token -> finished
    e2e_latency_ms          arrival -> finished
    num_output_tokens, num_cached_tokens (prefix-cache hit tokens)
    kv_transfer_bytes       KV read from a prefill instance (P2pConnector) -- these three
    kv_transfer_ms          only when the request read KV: the read (wire + copy in)
    kv_transfer_wait_ms     first scheduled -> the KV in place (queueing + transfer)

A prefill instance's non-streaming response also carries vLLM's top-level
`kv_transfer_params` (the handshake for the decode instance; absent otherwise).

"Arrival" is when the server handed the tokenized request to the engine (as in vLLM, after
parsing, templating and tokenization).
"""

from __future__ import annotations

from typing import Any

from workbench.core.request import RequestTimes


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1000.0, 3)


def request_metrics(
    times: RequestTimes | None, num_output_tokens: int, num_cached_tokens: int
) -> dict[str, Any] | None:
    if times is None:
        return None
    last = times.token_times[-1] if times.token_times else None
    gen_ms = _ms(times.first_token, last)
    itl = None
    if gen_ms is not None and num_output_tokens > 1:
        itl = round(gen_ms / (num_output_tokens - 1), 3)
    infer_ms = _ms(times.first_scheduled, last)
    tps = None
    if infer_ms and num_output_tokens:
        tps = round(num_output_tokens / (infer_ms / 1000.0), 3)
    out: dict[str, Any] = {
        "queue_time_ms": _ms(times.arrival, times.first_scheduled),
        "time_to_first_token_ms": _ms(times.first_scheduled, times.first_token),
        "generation_time_ms": gen_ms,
        "mean_itl_ms": itl,
        "tokens_per_second": tps,
        "arrival_to_first_token_ms": _ms(times.arrival, times.first_token),
        "prefill_time_ms": _ms(times.first_scheduled, times.first_token),
        "decode_time_ms": _ms(times.first_token, times.finished),
        "e2e_latency_ms": _ms(times.arrival, times.finished),
        "num_output_tokens": num_output_tokens,
        "num_cached_tokens": max(num_cached_tokens, 0),
    }
    if times.kv_load_start is not None and times.kv_load_done is not None:
        out["kv_transfer_bytes"] = times.kv_transfer_bytes
        out["kv_transfer_ms"] = round(times.kv_transfer_s * 1000.0, 3)
        out["kv_transfer_wait_ms"] = _ms(times.kv_load_start, times.kv_load_done)
    return out
