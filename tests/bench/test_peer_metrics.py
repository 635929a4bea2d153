"""peer_definitions on a 2-request example, every value computed by hand."""

from __future__ import annotations

import math

import pytest

from workbench.harness.metrics import RequestRecord
from workbench.harness.peer_metrics import PEER_COLUMNS, PEER_TOOLS, peer_definitions

approx = pytest.approx


def two_requests() -> list[RequestRecord]:
    """A: 4 one-token chunks.  B: 5 tokens in 3 chunks (1, 2, 2), sent at 0.5 s."""
    a = RequestRecord(
        request_id="a",
        prompt_tokens=16,
        output_tokens=4,
        success=True,
        start_s=0.0,
        first_token_s=0.10,
        chunk_times_s=[0.10, 0.15, 0.25, 0.30],
        chunk_tokens=[1, 1, 1, 1],
        end_s=0.30,
    )
    b = RequestRecord(
        request_id="b",
        prompt_tokens=16,
        output_tokens=5,
        success=True,
        start_s=0.5,
        first_token_s=0.70,
        chunk_times_s=[0.70, 0.80, 1.00],
        chunk_tokens=[1, 2, 2],
        end_s=1.00,
    )
    return [a, b]


def row(tool: str, records: list[RequestRecord]) -> dict[str, object]:
    df = peer_definitions(records)
    return df.set_index("tool").loc[tool].to_dict()


def test_shape() -> None:
    df = peer_definitions(two_requests())
    assert list(df.columns) == PEER_COLUMNS
    assert tuple(df["tool"]) == PEER_TOOLS


def test_vllm() -> None:
    # ITL: pooled gaps [50, 100, 50] + [100, 200] ms; sorted [50, 50, 100, 100, 200].
    # TPOT: A (300 - 100) / 3 = 66.67, B (500 - 200) / 4 = 75.
    r = row("vLLM", two_requests())
    assert r["itl_mean_ms"] == approx(100.0)
    assert r["itl_median_ms"] == approx(100.0)
    assert r["itl_p95_ms"] == approx(180.0)  # rank 3.8: 100 + 0.8 * 100
    assert r["tpot_mean_ms"] == approx((200 / 3 + 75) / 2)
    assert r["tpot_median_ms"] == approx((200 / 3 + 75) / 2)
    assert r["tpot_p95_ms"] == approx(200 / 3 + 0.95 * (75 - 200 / 3))


def test_guidellm_token_weighted() -> None:
    # ITL: A (300 - 100) / 3 = 66.67 weight 3; B (1000 - 700) / 4 = 75 weight 4.
    #   mean = (200 + 300) / 7; CDF [3/7, 1] -> median and p95 both pick 75.
    # TPOT (TTFT included): A 300 / 4 = 75 weight 4; B 500 / 5 = 100 weight 5.
    #   mean = (300 + 500) / 9; CDF [4/9, 1] -> median and p95 pick 100.
    r = row("GuideLLM", two_requests())
    assert r["itl_mean_ms"] == approx(500 / 7)
    assert r["itl_median_ms"] == approx(75.0)
    assert r["itl_p95_ms"] == approx(75.0)
    assert r["tpot_mean_ms"] == approx(800 / 9)
    assert r["tpot_median_ms"] == approx(100.0)
    assert r["tpot_p95_ms"] == approx(100.0)


def test_aiperf_itl_is_per_request_decode_average() -> None:
    # (last - first) / (N - 1): A 66.67, B 75 -> unweighted, linear percentiles.
    r = row("AIPerf", two_requests())
    assert r["itl_mean_ms"] == approx((200 / 3 + 75) / 2)
    assert r["itl_median_ms"] == approx((200 / 3 + 75) / 2)
    assert r["itl_p95_ms"] == approx(200 / 3 + 0.95 * (75 - 200 / 3))
    assert math.isnan(r["tpot_mean_ms"])  # type: ignore[arg-type]


def test_llmperf_itl_includes_ttft() -> None:
    # (last - start) / N: A 300 / 4 = 75, B 500 / 5 = 100.
    r = row("LLMPerf", two_requests())
    assert r["itl_mean_ms"] == approx(87.5)
    assert r["itl_median_ms"] == approx(87.5)
    assert r["itl_p95_ms"] == approx(98.75)  # 75 + 0.95 * 25
    assert math.isnan(r["tpot_p95_ms"])  # type: ignore[arg-type]


def test_failed_and_single_token_requests() -> None:
    recs = two_requests()
    recs.append(
        RequestRecord(
            request_id="failed",
            prompt_tokens=1,
            output_tokens=9,
            success=False,
            error="timeout",
            chunk_times_s=[3.0, 9.0],
        )
    )
    single = RequestRecord(
        request_id="one",
        prompt_tokens=1,
        output_tokens=1,
        success=True,
        start_s=0.0,
        first_token_s=0.2,
        chunk_times_s=[0.2],
        chunk_tokens=[1],
        end_s=0.2,
    )
    # The failed request changes nothing.
    base = peer_definitions(two_requests()).set_index("tool")
    with_failed = peer_definitions(recs).set_index("tool")
    assert with_failed["itl_mean_ms"].tolist() == approx(base["itl_mean_ms"].tolist())
    # A 1-token request has no ITL in vLLM/GuideLLM/AIPerf; LLMPerf still divides by N = 1.
    only = peer_definitions([single]).set_index("tool")
    assert math.isnan(only.loc["vLLM", "itl_mean_ms"])
    assert math.isnan(only.loc["GuideLLM", "itl_mean_ms"])
    assert math.isnan(only.loc["AIPerf", "itl_mean_ms"])
    assert only.loc["LLMPerf", "itl_mean_ms"] == approx(200.0)
    assert only.loc["GuideLLM", "tpot_mean_ms"] == approx(200.0)
