"""/metrics parsed with prometheus_client's parser: vLLM's names and labels, counters and
histograms that move by exactly what the requests did, live gauges."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME, ServerHandle
from workbench.server.metrics import build_1_2_5_buckets

HISTOGRAMS = (
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_n",
    "vllm:request_params_max_tokens", "vllm:iteration_tokens_total",
)
COUNTERS = (
    "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
    "vllm:num_preemptions", "vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def _complete(s: ServerHandle, prompt: Any, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    r = httpx.post(f"{s.base_url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_names_types_and_labels(idle_server: ServerHandle) -> None:
    _complete(idle_server, "warm up", 3)
    r = httpx.get(f"{idle_server.base_url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in HISTOGRAMS:
        assert families[name].type == "histogram", name
    for name in COUNTERS:
        assert families[name].type == "counter", name
    for name in GAUGES:
        assert families[name].type == "gauge", name
    for name in (*HISTOGRAMS, *COUNTERS, *GAUGES):
        for sample in families[name].samples:
            assert sample.labels["model_name"] == MODEL_NAME and sample.labels["engine"] == "0"
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error"}
    ttft_buckets = [s.labels["le"] for s in families["vllm:time_to_first_token_seconds"].samples
                    if s.name.endswith("_bucket")]
    assert ttft_buckets[:3] == ["0.001", "0.005", "0.01"] and ttft_buckets[-1] == "+Inf"
    assert not any(s.name.endswith("_created") for f in families.values() for s in f.samples)
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16"


def test_counters_and_histograms_move_with_requests(idle_server: ServerHandle) -> None:
    before = idle_server.metrics()
    outs = [_complete(idle_server, f"request number {i} of three", 7) for i in range(3)]
    prompt_tokens = sum(o["usage"]["prompt_tokens"] for o in outs)
    after = idle_server.metrics()

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta("vllm:prompt_tokens_total") == prompt_tokens
    assert delta("vllm:generation_tokens_total") == 21
    assert delta("vllm:request_success_total{finished_reason=length}") == 3
    for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
              "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
              "vllm:request_time_per_output_token_seconds"):
        assert delta(f"{h}_count") == 3, h
        assert delta(f"{h}_sum") >= 0, h
    assert delta("vllm:inter_token_latency_seconds_count") == 3 * 6
    assert delta("vllm:request_generation_tokens_sum") == 21
    assert delta("vllm:request_prompt_tokens_sum") == prompt_tokens
    assert delta("vllm:request_params_max_tokens_sum") == 21
    assert delta("vllm:iteration_tokens_total_sum") >= prompt_tokens + 21 - 3
    assert after["vllm:time_to_first_token_seconds_bucket{le=+Inf}"] == after[
        "vllm:time_to_first_token_seconds_count"]
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


def test_prefix_cache_counters(idle_server: ServerHandle) -> None:
    ids = [10 + (7 * i) % 900 for i in range(80)]  # five full blocks of 16
    before = idle_server.metrics()
    _complete(idle_server, ids, 2)
    _complete(idle_server, ids, 2)
    after = idle_server.metrics()
    assert after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"] \
        >= 2 * 79
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] >= 64


def test_gauges_are_live_while_a_request_runs(idle_server: ServerHandle) -> None:
    body = {"prompt": "a long one", "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    seen: dict[str, float] = {}

    def stream() -> None:
        with httpx.stream("POST", f"{idle_server.base_url}/v1/completions", json=body,
                          timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and not seen:
                    m = idle_server.metrics()
                    seen.update(running=m["vllm:num_requests_running"],
                                usage=m["vllm:kv_cache_usage_perc"])

    t = threading.Thread(target=stream)
    t.start()
    t.join(timeout=120)
    assert seen["running"] == 1 and seen["usage"] > 0
    time.sleep(0.05)
    m = idle_server.metrics()
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0


def test_spec_decode_counters_pass_through(idle_server: ServerHandle,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    engine = idle_server.engine
    real = engine.stats

    def stats() -> dict[str, Any]:
        out: dict[str, Any] = real()
        out["vllm:spec_decode_num_drafts"] = 5
        out["vllm:spec_decode_num_accepted_tokens_per_pos"] = [4, 2, 1]
        return out

    monkeypatch.setattr(engine, "stats", stats)
    m = idle_server.metrics()
    assert m["vllm:spec_decode_num_drafts_total"] == 5
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total{position=2}"] == 1


def test_build_1_2_5_buckets() -> None:
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(256)[-1] == 200


def test_a_speculative_server_exports_real_spec_counters(model_dir: Any) -> None:
    """A server whose draft is the target itself: every draft accepted, the counters and the
    per-position series on /metrics say so, and the text equals the non-speculative one."""
    from tests.server.conftest import ENGINE_KW, start_server, stop_server
    from workbench.config import EngineConfig
    from workbench.server.app import build_app

    spec = {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 3}
    config = EngineConfig.from_kwargs(str(model_dir), speculative_config=spec, **ENGINE_KW)
    handle = start_server(build_app(config, served_model_name=MODEL_NAME))
    try:
        out = _complete(handle, [11, 12, 13, 14, 15], max_tokens=9)
        m = handle.metrics()
    finally:
        stop_server(handle)
    assert len(out["choices"][0]["text"]) > 0
    drafts = m["vllm:spec_decode_num_drafts_total"]
    # 9 tokens: 1 from the prefill, then two verifications of 3 drafts + the bonus (4 + 4);
    # the second is exactly what max_tokens still allows (9 - 5 - 1 = 3 drafts)
    assert drafts == 2
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == m[
        "vllm:spec_decode_num_draft_tokens_total"] == 6
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total{position=0}"] == 2
    assert m["vllm:generation_tokens_total"] == 9
