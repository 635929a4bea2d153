"""The metric registry lists exactly the metrics the harness computes, with one row each."""

from __future__ import annotations

import pytest

from workbench.harness.metrics import SLO, RequestRecord, compute_metrics, summary_table
from workbench.metrics import registry


def _records() -> list[RequestRecord]:
    """Two successful requests with server timestamps (KV read from a prefill instance
    too), one failed."""
    server = {"server_queue_s": 0.01, "server_prefill_s": 0.02, "server_decode_s": 0.1,
              "server_ttft_s": 0.03, "server_e2e_s": 0.13, "server_kv_transfer_s": 0.001,
              "server_kv_wait_s": 0.004}
    return [
        RequestRecord("a", 10, 3, True, start_s=0.0, first_token_s=0.1,
                      chunk_times_s=[0.1, 0.2, 0.3], chunk_tokens=[1, 1, 1], end_s=0.3, **server),
        RequestRecord("b", 5, 2, True, start_s=0.1, first_token_s=0.3,
                      chunk_times_s=[0.3, 0.35], chunk_tokens=[1, 1], end_s=0.35, **server),
        RequestRecord("c", 7, 0, False, error="boom", start_s=0.2),
    ]


@pytest.mark.parametrize("percentiles", [(50, 90, 95, 99), (50, 99.9)])
def test_every_computed_metric_is_registered_and_vice_versa(percentiles: tuple) -> None:
    m = compute_metrics(_records(), 1.0, percentiles=percentiles, slo=SLO(ttft_ms=500))
    assert list(m) and all(registry.spec(k, percentiles) is not None for k in m), \
        [k for k in m if registry.spec(k, percentiles) is None]
    assert set(m) == set(registry.metric_names(("client", "server"), percentiles))


def test_run_level_metrics_are_the_registry_run_rows() -> None:
    from workbench.experiments.child_run import phase_shares

    shares = phase_shares([{"duration_s": 1.0, "prefill_tokens": 3},
                           {"duration_s": 3.0, "prefill_tokens": 0}])
    from workbench.harness.cache_metrics import kv_cache_metrics

    every_counter = {  # a delta with every counter kv_cache_metrics reads
        name: 1.0 for name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                               "vllm:external_prefix_cache_hits",
                               "vllm:external_prefix_cache_queries",
                               "workbench:kv_offload_host_hits", "workbench:kv_offload_disk_hits",
                               "vllm:kv_offload_load_bytes", "vllm:kv_offload_store_bytes",
                               "vllm:num_preemptions", "vllm:kv_offload_load_time")}
    cache = kv_cache_metrics(every_counter, engine_time_s=4.0)
    logged = set(shares) | set(cache) | {"valid", "other_cpu_share"}  # + Store.log_validity
    assert logged == set(registry.metric_names(("run",)))
    assert cache["kv_transfer_time_share"] == 0.25 and cache["prefix_cache_hit_rate"] == 1.0


def test_server_histograms_are_the_registry_prometheus_rows() -> None:
    from prometheus_client import Histogram

    from workbench.server.metrics import ServerMetrics

    server = ServerMetrics(None, "m", 2048)  # type: ignore[arg-type]  # no scrape here
    hists = {c._name: c._documentation for c in server.registry._collector_to_names
             if isinstance(c, Histogram)}
    rows = {r.name: r.description for r in registry.METRICS if r.source == "prometheus"}
    assert hists == rows


def test_rows_are_well_formed_and_names_resolve() -> None:
    names = registry.metric_names(registry.SOURCES)
    assert len(names) == len(set(names))
    for name in names:
        row = registry.get(name)
        assert row.name == name and not row.is_family and row.unit and row.description
    assert registry.get("p95_ttft_ms").unit == "ms"
    assert registry.get("p95_ttft_ms").direction == "lower"
    assert registry.get("output_throughput").direction == "higher"
    assert registry.get("duration").direction == "none"
    assert registry.spec("p95_server_ttft_ms") is not None
    assert registry.spec("p99_server_ttft_ms") is None  # server families report p95 only
    assert registry.spec("std_server_e2e_ms") is None
    assert registry.spec("p99.9_ttft_ms", (50, 99)) is None
    assert registry.spec("ttft") is None  # a family is not a metric
    with pytest.raises(KeyError, match="did you mean 'p95_ttft_ms'"):
        registry.get("p95_tfft_ms")


def test_slo_bounds_are_lower_is_better_metrics() -> None:
    for key, metric in registry.SLO_BOUNDS.items():
        assert registry.get(metric).direction == "lower", key


def test_no_direction_is_guessed_from_a_name() -> None:
    """A name the registry does not know has no direction, whatever its suffix."""
    assert registry.direction("made_up_ms") == "none"


def test_summary_table_labels_and_units_come_from_the_registry() -> None:
    table = summary_table(compute_metrics(_records(), 2.0, slo=SLO(ttft_ms=500)))
    assert "| Benchmark duration (s) | 2.00 |" in table
    assert "| Successful requests | 2 |" in table
    assert "| Error rate | 0.3333 |" in table
    assert "| Output token throughput (tok/s) | 2.50 |" in table
    assert "| **Server: queue (arrival -> scheduled)** | |" in table
    assert "| P95 server queue (ms) | 10.00 |" in table


def test_docs_metrics_table_matches_the_registry() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert registry.markdown_table() in doc, (
        "regenerate: python -m workbench.metrics.registry")


def test_engine_stats_keys_are_the_registry_engine_rows() -> None:
    from workbench.metrics.stats import EngineStats

    stats = EngineStats()
    stats.record_spec(3, 2)  # the per-position counter appears once speculation ran
    vllm_keys = {k for k in stats.snapshot() if k.startswith(("vllm:", "workbench:"))}
    rows = {r.name for r in registry.METRICS if r.source == "engine"}
    assert vllm_keys == rows
    assert set(registry.engine_names("gauge")) == set(stats.gauges)
    assert all(registry.get(k).kind == "counter" for k in stats.counters)


def test_server_exports_engine_rows_with_the_registry_help_and_type() -> None:
    from prometheus_client import generate_latest

    from workbench.metrics.stats import EngineStats
    from workbench.server.metrics import ServerMetrics

    class _Engine:  # what the collector reads from AsyncEngine at scrape time
        stats = EngineStats().snapshot
        num_gpu_blocks = 8

        class config:  # noqa: N801 - EngineConfig's attribute chain
            class cache_config:  # noqa: N801
                block_size, enable_prefix_caching, kv_cache_dtype = 16, True, "auto"

    metrics = ServerMetrics(_Engine(), "m", 2048)  # type: ignore[arg-type]
    text = generate_latest(metrics.registry).decode()
    for row in registry.METRICS:
        if row.source == "engine" and row.name != "vllm:spec_decode_num_accepted_tokens_per_pos":
            name = row.name + ("_total" if row.kind == "counter" else "")  # the text format's
            assert f"# HELP {name} {row.description}\n# TYPE {name} {row.kind}\n" in text, name
