"""Replica metrics re-exported with a `replica` label plus aggregates; the per-replica summary;
scaling efficiency."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from workbench.analysis.replicas import replica_summary, split_key
from workbench.harness import prom
from workbench.planning import scaling_efficiency
from workbench.router.metrics import replica_families


def replica_text(hits: float, queries: float, usage: float, running: float,
                 ttft: list[float]) -> str:
    le = [0.1, 1.0]
    buckets = "".join(
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{b}",model_name="m"}} '
        f"{sum(t <= b for t in ttft)}\n" for b in le)
    return f"""\
# HELP vllm:prefix_cache_hits prefix hits
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
# HELP vllm:prefix_cache_queries prefix queries
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
# HELP vllm:kv_cache_usage_perc usage
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}
# HELP vllm:num_requests_running running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
# HELP vllm:time_to_first_token_seconds ttft
# TYPE vllm:time_to_first_token_seconds histogram
{buckets}vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {len(ttft)}
vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {len(ttft)}
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {sum(ttft)}
"""


class _Families:
    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts

    def collect(self):  # type: ignore[no-untyped-def]
        return replica_families(self.texts)


def render(texts: dict[int, str]) -> str:
    reg = CollectorRegistry()
    reg.register(_Families(texts))  # type: ignore[arg-type]
    return generate_latest(reg).decode()


def test_replica_series_get_a_label_and_aggregates_sum_or_average() -> None:
    text = render({0: replica_text(32, 64, 0.5, 2, [0.05, 0.5]),
                   1: replica_text(0, 48, 0.25, 1, [2.0])})
    flat = prom.parse(text, buckets=True)
    assert flat['vllm:prefix_cache_hits_total{replica="0"}'] == 32
    assert flat['vllm:prefix_cache_hits_total{replica="1"}'] == 0
    assert flat["vllm:prefix_cache_hits_total"] == 32  # the aggregate: summed
    assert flat["vllm:prefix_cache_queries_total"] == 112
    assert flat["vllm:num_requests_running"] == 3
    assert flat["vllm:kv_cache_usage_perc"] == 0.375  # a ratio: averaged
    assert flat['vllm:time_to_first_token_seconds_bucket{le="0.1"}'] == 1
    assert flat['vllm:time_to_first_token_seconds_bucket{le="1.0"}'] == 2
    assert flat["vllm:time_to_first_token_seconds_count"] == 3
    assert flat["vllm:time_to_first_token_seconds_sum"] == pytest.approx(2.55)
    # the bench's line scan (Poller) reads the aggregate only, not the per-replica copies
    assert prom.series_from_text(text) == {"running": 3.0, "kv_cache_usage_perc": 0.375}


def test_replica_summary_from_a_run_delta() -> None:
    before = prom.parse(render({0: replica_text(0, 0, 0, 0, []), 1: replica_text(0, 0, 0, 0, [])}))
    after = prom.parse(render({0: replica_text(32, 64, 0, 0, [0.05, 0.5]),
                               1: replica_text(0, 48, 0, 0, [2.0])}))
    after.update({'router_requests_total{replica="0"}': 2.0,
                  'router_requests_total{replica="1"}': 2.0,
                  'router_retries_total{replica="1"}': 1.0,
                  'router_replica_failures_total{replica="1"}': 1.0})
    delta = prom.delta(before, after)
    assert delta["vllm:prefix_cache_hit_rate:delta"] == 32 / 112
    rows = replica_summary(delta)
    assert [r["replica"] for r in rows] == ["0", "1", "all"]
    r0, r1, total = rows
    assert (r0["requests"], r0["prefix_cache_hits"], r0["prefix_hit_rate"]) == (2, 32, 0.5)
    assert r0["mean_ttft_ms"] == pytest.approx(275.0)
    assert (r1["retries"], r1["failures"], r1["prefix_hit_rate"]) == (1, 1, 0.0)
    assert total["requests"] == 4 and total["retries"] == 1
    assert total["prefix_hit_rate"] == 32 / 112
    assert total["mean_ttft_ms"] == pytest.approx(850.0)
    assert math.isnan(replica_summary({})[0]["prefix_hit_rate"])
    assert split_key('a{x="1",replica="0"}') == ("a", {"x": "1", "replica": "0"})


def test_scaling_efficiency() -> None:
    assert scaling_efficiency(180.0, 100.0, 2) == 0.9
    assert scaling_efficiency(100.0, 100.0, 1) == 1.0
    assert scaling_efficiency(0.0, 50.0, 4) == 0.0
    with pytest.raises(ValueError, match="throughput_1 must be > 0"):
        scaling_efficiency(10.0, 0.0, 2)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        scaling_efficiency(10.0, 5.0, 0)
    with pytest.raises(ValueError, match="throughput_n must be a number >= 0"):
        scaling_efficiency(-1.0, 5.0, 2)


def test_disaggregated_aggregates_count_each_request_once() -> None:
    """Replica 0 prefilled, replica 1 decoded the same 2 requests: the unlabelled request
    histogram and request counter sum the decode replica only; token counters sum both."""
    from prometheus_client import CollectorRegistry, generate_latest

    from workbench.harness import prom
    from workbench.router.metrics import replica_families

    def text(requests: int, tokens: int) -> str:
        return ("# TYPE vllm:e2e_request_latency_seconds histogram\n"
                f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf"}} {requests}\n'
                f"vllm:e2e_request_latency_seconds_count {requests}\n"
                "vllm:e2e_request_latency_seconds_sum 1.0\n"
                "# TYPE vllm:request_success_total counter\n"
                f'vllm:request_success_total{{finished_reason="length"}} {requests}\n'
                "# TYPE vllm:prompt_tokens_total counter\n"
                f"vllm:prompt_tokens_total {tokens}\n")

    class One:
        def __init__(self, families: list) -> None:
            self.families = families

        def collect(self) -> list:
            return self.families

    reg = CollectorRegistry()
    reg.register(One(list(replica_families({0: text(2, 100), 1: text(2, 4)}, {1}))))
    flat = prom.parse(generate_latest(reg).decode())
    assert flat["vllm:e2e_request_latency_seconds_count"] == 2
    assert flat['vllm:e2e_request_latency_seconds_count{replica="0"}'] == 2
    assert flat['vllm:request_success_total{finished_reason="length"}'] == 2
    assert flat["vllm:prompt_tokens_total"] == 104
