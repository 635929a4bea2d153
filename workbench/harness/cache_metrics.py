"""A run's KV-cache read-out from the engine counters' delta over the run (`RunResult.
server_delta`: the in-process engine's `stats()`, or the server's /metrics), one number each:

    prefix_cache_hit_rate            device prefix-cache hits / queries (tokens)
    external_prefix_cache_hit_rate   KV connector hits / queries (tokens loaded, not computed)
    kv_host_hit_tokens, kv_disk_hit_tokens   external hits per tier
    kv_load_bytes, kv_store_bytes    bytes moved into / out of the device KV cache
    kv_transfer_time_share           (load + store + swap-out seconds) / engine time
    num_preemptions                  preemptions during the run

Only what the delta has is returned (a server without a connector: no kv_* keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _get(delta: Mapping[str, Any], name: str) -> float | None:
    for key in (name, name + "_total"):  # stats() names / Prometheus counter names
        v = delta.get(key)
        if isinstance(v, int | float):
            return float(v)
    return None


def kv_cache_metrics(delta: Mapping[str, Any], engine_time_s: float | None = None
                     ) -> dict[str, float]:
    out: dict[str, float] = {}
    for rate, hits, queries in (
        ("prefix_cache_hit_rate", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
        ("external_prefix_cache_hit_rate", "vllm:external_prefix_cache_hits",
         "vllm:external_prefix_cache_queries"),
    ):
        h, q = _get(delta, hits), _get(delta, queries)
        if h is not None and q:
            out[rate] = h / q
    for name, key in (("kv_host_hit_tokens", "workbench:kv_offload_host_hits"),
                      ("kv_disk_hit_tokens", "workbench:kv_offload_disk_hits"),
                      ("kv_load_bytes", "vllm:kv_offload_load_bytes"),
                      ("kv_store_bytes", "vllm:kv_offload_store_bytes"),
                      ("num_preemptions", "vllm:num_preemptions")):
        v = _get(delta, key)
        if v is not None:
            out[name] = v
    times = [_get(delta, k) for k in ("vllm:kv_offload_load_time", "vllm:kv_offload_store_time",
                                      "workbench:kv_swap_out_time")]
    if engine_time_s and any(t is not None for t in times):
        out["kv_transfer_time_share"] = sum(t or 0.0 for t in times) / engine_time_s
    return out
