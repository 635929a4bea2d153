"""compute_metrics against hand-computed values (vLLM's definitions), plus frame and table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.harness.metrics import (
    SLO,
    RequestRecord,
    compute_metrics,
    percentile_key,
    records_frame,
    summary_table,
)

approx = pytest.approx


def three_requests() -> list[RequestRecord]:
    """r0: 4 tokens; r1: 1 token; r2: failed (its timings must be ignored)."""
    r0 = RequestRecord(
        request_id="r0",
        prompt_tokens=10,
        output_tokens=4,
        success=True,
        target_arrival_s=0.0,
        start_s=0.0,
        first_token_s=0.2,
        chunk_times_s=[0.2, 0.3, 0.5, 0.6],
        chunk_tokens=[1, 1, 1, 1],
        end_s=0.6,
    )
    r1 = RequestRecord(
        request_id="r1",
        prompt_tokens=20,
        output_tokens=1,
        success=True,
        target_arrival_s=0.05,
        start_s=0.1,
        first_token_s=0.4,
        chunk_times_s=[0.4],
        chunk_tokens=[1],
        end_s=0.4,
    )
    r2 = RequestRecord(
        request_id="r2",
        prompt_tokens=30,
        output_tokens=0,
        success=False,
        error="boom",
        start_s=0.2,
        first_token_s=5.0,
        chunk_times_s=[5.0, 9.0],
        chunk_tokens=[1, 1],
        end_s=9.0,
    )
    return [r0, r1, r2]


def test_record_properties() -> None:
    r0, r1, r2 = three_requests()
    assert r0.ttft_s == approx(0.2)
    assert r0.e2e_s == approx(0.6)
    assert r0.tpot_s == approx(0.4 / 3)
    assert r0.itls_s == approx([0.1, 0.2, 0.1])
    assert r0.lateness_s == approx(0.0)
    assert r1.tpot_s is None
    assert r1.itls_s == []
    assert r1.lateness_s == approx(0.05)
    assert r2.lateness_s is None


def test_hand_computed_three_requests() -> None:
    m = compute_metrics(three_requests(), duration_s=2.0)
    assert m["completed"] == 2
    assert m["failed"] == 1
    assert m["error_rate"] == approx(1 / 3)
    assert m["total_input_tokens"] == 30  # failed request's 30 prompt tokens excluded
    assert m["total_output_tokens"] == 5
    assert m["request_throughput"] == approx(1.0)
    assert m["output_throughput"] == approx(2.5)
    assert m["total_token_throughput"] == approx(17.5)
    assert "request_goodput" not in m

    # TTFT [200, 300]
    assert m["mean_ttft_ms"] == approx(250.0)
    assert m["median_ttft_ms"] == approx(250.0)
    assert m["std_ttft_ms"] == approx(50.0)
    assert m["p99_ttft_ms"] == approx(299.0)  # 200 + 0.99 * 100
    # TPOT only r0: (600 - 200) / 3
    assert m["mean_tpot_ms"] == approx(400 / 3)
    assert m["median_tpot_ms"] == approx(400 / 3)
    assert m["std_tpot_ms"] == approx(0.0)
    assert m["p99_tpot_ms"] == approx(400 / 3)
    # ITL pooled [100, 200, 100]
    assert m["mean_itl_ms"] == approx(400 / 3)
    assert m["median_itl_ms"] == approx(100.0)
    assert m["std_itl_ms"] == approx(math.sqrt(20000 / 9))  # population std
    assert m["p99_itl_ms"] == approx(198.0)  # 100 + 0.98 * 100 at rank 1.98
    # E2EL [600, 300]
    assert m["mean_e2el_ms"] == approx(450.0)
    assert m["median_e2el_ms"] == approx(450.0)
    assert m["std_e2el_ms"] == approx(150.0)
    assert m["p99_e2el_ms"] == approx(597.0)
    for q in (50, 90, 95, 99):
        assert f"p{q}_itl_ms" in m


def test_goodput_excludes_exactly_one() -> None:
    recs = three_requests()
    # TTFT bound 250 ms: r0 (200) good, r1 (300) not, r2 failed -> 1 good over 2 s.
    assert compute_metrics(recs, 2.0, slo=SLO(ttft_ms=250))["request_goodput"] == approx(0.5)
    # TPOT bound 100 ms: r0 (133.3) not good, r1 counts TPOT as 0 -> good.
    assert compute_metrics(recs, 2.0, slo=SLO(tpot_ms=100))["request_goodput"] == approx(0.5)
    # Bounds are inclusive (vLLM: slo >= value): r0's E2EL is exactly 600 ms.
    assert compute_metrics(recs, 2.0, slo=SLO(e2el_ms=600))["request_goodput"] == approx(1.0)
    assert compute_metrics(recs, 2.0, slo=SLO(e2el_ms=599))["request_goodput"] == approx(0.5)
    # All bounds must hold: r0 fails TPOT, r1 passes both.
    both = SLO(tpot_ms=100, e2el_ms=600)
    assert compute_metrics(recs, 2.0, slo=both)["request_goodput"] == approx(0.5)
    # An SLO with no bound reports no goodput, as vLLM without --goodput.
    assert "request_goodput" not in compute_metrics(recs, 2.0, slo=SLO())


def test_multi_token_chunks_one_gap_per_chunk() -> None:
    r = RequestRecord(
        request_id="m",
        prompt_tokens=8,
        output_tokens=6,
        success=True,
        start_s=0.0,
        first_token_s=0.1,
        chunk_times_s=[0.1, 0.2, 0.4],
        chunk_tokens=[1, 3, 2],
        end_s=0.4,
    )
    m = compute_metrics([r], duration_s=1.0, percentiles=(50,))
    assert m["mean_itl_ms"] == approx(150.0)  # gaps 100 and 200, not divided by tokens
    assert m["median_itl_ms"] == approx(150.0)
    assert m["mean_tpot_ms"] == approx(60.0)  # (400 - 100) / (6 - 1)
    assert m["total_output_tokens"] == 6
    assert m["output_throughput"] == approx(6.0)


def test_percentile_naming() -> None:
    assert percentile_key(99) == "99"
    assert percentile_key(99.0) == "99"
    assert percentile_key(99.9) == "99.9"
    m = compute_metrics(three_requests(), 2.0, percentiles=(25.0, 50, 99.9))
    assert {"p25_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms", "p99.9_e2el_ms"} <= set(m)
    assert "p99_ttft_ms" not in m
    assert m["p99.9_ttft_ms"] == approx(299.9)
    assert m["p50_ttft_ms"] == approx(m["median_ttft_ms"])


def test_empty_series_give_zero_like_vllm() -> None:
    failed = three_requests()[2]
    m = compute_metrics([failed], 1.0)
    assert m["completed"] == 0 and m["failed"] == 1 and m["error_rate"] == 1.0
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert m[f"mean_{name}_ms"] == 0.0
        assert m[f"std_{name}_ms"] == 0.0
        assert m[f"p99_{name}_ms"] == 0.0
    assert compute_metrics([], 1.0)["error_rate"] == 0.0


def test_server_side_metrics_when_present() -> None:
    recs = three_requests()
    assert not any(k.startswith("mean_server") for k in compute_metrics(recs, 2.0))
    recs[0].server_queue_s, recs[1].server_queue_s = 0.010, 0.030
    recs[2].server_queue_s = 9.0  # failed: ignored
    recs[0].server_prefill_s = 0.1
    m = compute_metrics(recs, 2.0)
    assert m["mean_server_queue_ms"] == approx(20.0)
    assert m["median_server_queue_ms"] == approx(20.0)
    assert m["p95_server_queue_ms"] == approx(29.0)
    assert m["mean_server_prefill_ms"] == approx(100.0)
    assert "mean_server_decode_ms" not in m


def test_validation() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        compute_metrics(three_requests(), 0.0)
    with pytest.raises(ValueError, match="percentile"):
        compute_metrics(three_requests(), 1.0, percentiles=(101,))
    with pytest.raises(ValueError, match="ttft_ms"):
        SLO(ttft_ms=-1)


def test_records_frame() -> None:
    df = records_frame(three_requests())
    assert isinstance(df, pd.DataFrame)
    assert len(df) == 3
    assert {"request_id", "chunk_times_s", "server_e2e_s", "ttft_ms", "tpot_ms", "e2e_ms"} <= set(
        df.columns
    )
    assert df.loc[0, "ttft_ms"] == approx(200.0)
    assert df.loc[0, "tpot_ms"] == approx(400 / 3)
    assert math.isnan(df.loc[1, "tpot_ms"])
    assert df.loc[1, "lateness_ms"] == approx(50.0)
    assert df.loc[0, "num_chunks"] == 4
    assert df["server_decode_s"].dtype == "float64"  # all None -> NaN, still numeric
    assert list(records_frame([]).columns) == list(df.columns)


def test_summary_table_order() -> None:
    m = compute_metrics(three_requests(), 2.0, percentiles=(50, 99.9), slo=SLO(ttft_ms=250))
    table = summary_table(m)
    assert table.startswith("| Serving Benchmark Result |")
    labels = [
        "Successful requests",
        "Failed requests",
        "Benchmark duration (s)",
        "Total input tokens",
        "Total generated tokens",
        "Request throughput (req/s)",
        "Request goodput (req/s)",
        "Output token throughput (tok/s)",
        "Total token throughput (tok/s)",
        "Mean TTFT (ms)",
        "P99.9 TTFT (ms)",
        "Mean TPOT (ms)",
        "Mean ITL (ms)",
        "Mean E2EL (ms)",
        "P99.9 E2EL (ms)",
    ]
    positions = [table.index(f"| {label} |") for label in labels]
    assert positions == sorted(positions)
    assert "| Mean TTFT (ms) | 250.00 |" in table
    assert "| Successful requests | 2 |" in table
    assert "P50 TTFT" in table and "Std" not in table
