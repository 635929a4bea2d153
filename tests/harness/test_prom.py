"""prom: parsing vLLM's /metrics text, before/after deltas, histogram means, the fast scan."""

from __future__ import annotations

import pytest

from workbench.harness import prom

# The shape vLLM's prometheus_client output has (two data-parallel engines, two models).
BEFORE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_running{engine="0",model_name="other"} 9.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 50.0
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 7.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 200.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 5.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 10.0
"""


def _after() -> str:
    return (BEFORE
            .replace('model_name="m"} 100.0', 'model_name="m"} 160.0')
            .replace('"length",model_name="m"} 7.0', '"length",model_name="m"} 11.0')
            .replace('queries_total{engine="0",model_name="m"} 1000.0',
                     'queries_total{engine="0",model_name="m"} 1400.0')
            .replace('hits_total{engine="0",model_name="m"} 200.0',
                     'hits_total{engine="0",model_name="m"} 300.0')
            .replace('seconds_count{engine="0",model_name="m"} 5.0',
                     'seconds_count{engine="0",model_name="m"} 9.0')
            .replace('first_token_seconds_sum{engine="0",model_name="m"} 0.5',
                     'first_token_seconds_sum{engine="0",model_name="m"} 1.3')
            .replace('latency_seconds_sum{engine="0",model_name="m"} 10.0',
                     'latency_seconds_sum{engine="0",model_name="m"} 22.0'))


def test_parse_flattens_filters_and_aggregates() -> None:
    snap = prom.parse(BEFORE, model="m")
    assert snap["vllm:num_requests_running"] == 4.0  # summed over engines, other model out
    assert snap["vllm:kv_cache_usage_perc"] == 0.375  # a ratio is averaged
    assert snap["vllm:prompt_tokens_total"] == 150.0
    assert snap['vllm:request_success_total{finished_reason="length"}'] == 7.0
    assert snap["vllm:time_to_first_token_seconds_sum"] == 0.5
    assert not any("_created" in k or "_bucket" in k for k in snap)
    assert prom.parse(BEFORE)["vllm:num_requests_running"] == 13.0  # every model
    buckets = prom.parse(BEFORE, model="m", buckets=True)
    assert buckets['vllm:time_to_first_token_seconds_bucket{le="+Inf"}'] == 5.0


def test_delta_counters_histogram_means_and_rates() -> None:
    d = prom.delta(prom.parse(BEFORE, "m"), prom.parse(_after(), "m"))
    assert d["vllm:prompt_tokens_total"] == 60.0
    assert d['vllm:request_success_total{finished_reason="length"}'] == 4.0
    assert d["vllm:time_to_first_token_seconds_count"] == 4.0
    assert d["vllm:time_to_first_token_seconds:mean_delta"] == pytest.approx(0.8 / 4)
    assert d["vllm:e2e_request_latency_seconds:mean_delta"] == pytest.approx(12.0 / 4)
    assert d["vllm:prefix_cache_hit_rate:delta"] == pytest.approx(100 / 400)
    assert "vllm:num_requests_running" not in d  # gauges are levels, not amounts
    assert prom.check_request_count(d, 4) is None
    assert "Δcount = 4 but 3" in (prom.check_request_count(d, 3) or "")
    # a restarted server: its counters went down, the after value is the amount
    reset = prom.delta({"vllm:prompt_tokens_total": 500.0}, {"vllm:prompt_tokens_total": 20.0})
    assert reset["vllm:prompt_tokens_total"] == 20.0
    assert prom.delta({}, prom.parse(BEFORE)) == {}  # a failed before-scrape: no totals


def test_mlflow_keys_and_urls() -> None:
    d = {'vllm:request_success_total{finished_reason="length"}': 4.0, "vllm:x:mean_delta": 1.0,
         'vllm:h_bucket{le="+Inf"}': 2.0}
    assert prom.mlflow_safe(d) == {"server.vllm:request_success_total.finished_reason.length": 4.0,
                                   "server.vllm:x:mean_delta": 1.0,
                                   "server.vllm:h_bucket.le.plusInf": 2.0}
    assert prom.metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert prom.root_url("http://h:8000") == "http://h:8000"


def test_fast_series_scan_matches_the_parser() -> None:
    for text in (BEFORE, _after()):
        for model in ("m", None):
            assert prom.series_from_text(text, model) == prom.series_row(prom.parse(text, model))
    sglang = "sglang:num_running_reqs{model_name=\"q\"} 5\nsglang:num_queue_reqs 2 1700\n"
    assert prom.series_from_text(sglang) == {"running": 5.0, "waiting": 2.0}
    with pytest.raises(ValueError, match="interval_s"):
        prom.Poller("http://x/metrics", interval_s=0)
