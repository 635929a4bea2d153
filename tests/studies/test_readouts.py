"""Reading a study's runs back, with exact numbers from fixture results (no engine, no
store): the spec-decode counters of a point, k = 0's reference rows, the scaling row of a
num_replicas experiment, the tier experiment's run rows, the quality reference row."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from workbench.analysis.kv_tiers import TIER_COLUMNS, run_rows
from workbench.analysis.replicas import scaling_row
from workbench.analysis.spec import reference_frame, spec_metrics
from workbench.experiments.quality_report import QualityReport
from workbench.experiments.studies.kv_tiers import host_tier
from workbench.experiments.studies.quant_readout import QuantGroup, _label, _reference_row
from workbench.harness.spec_points import SpecPoint, spec_counters


def _run(value: Any, repeat: int, metrics: dict[str, float], valid: bool = True,
         error: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(value=value, repeat=repeat, metrics=metrics, valid=valid,
                           error=error, label="baseline" if value is None else str(value),
                           other_cpu_share=0.05)


def test_spec_counters_from_the_engine_and_from_a_server_delta() -> None:
    stats = {"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_draft_tokens": 30,
             "vllm:spec_decode_num_accepted_tokens": 21,
             "vllm:spec_decode_num_accepted_tokens_per_pos": [9, 7, 5]}
    assert spec_counters(stats) == (10, 30, 21, [9, 7, 5])
    delta = {"vllm:spec_decode_num_drafts_total": 10.0,
             "vllm:spec_decode_num_draft_tokens_total": 30.0,
             "vllm:spec_decode_num_accepted_tokens_total": 21.0,
             'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"}': 5.0,
             'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 9.0,
             'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="1"}': 7.0,
             "vllm:spec_decode_acceptance_rate:delta": 0.7}
    assert spec_counters(delta) == (10, 30, 21, [9, 7, 5])
    assert spec_counters({}) == (0, 0, 0, [])
    p = SpecPoint("ngram k=3", 1, [2.0, 1.0, 4.0], 100, *spec_counters(delta))
    assert p.output_tok_s == 50.0 and p.acceptance_rate == 0.7
    assert p.mean_acceptance_length == 3.1 and p.acceptance_by_position == [0.9, 0.7, 0.5]
    assert p.predicted_speedup == pytest.approx(100 / 79)


def test_k0_is_the_reference_and_logs_the_same_keys() -> None:
    frame = reference_frame([1, 4])
    assert list(frame["concurrency"]) == [1, 4] and (frame["k"] == 0).all()
    assert (frame["speedup"] == 1.0).all() and (frame["predicted_speedup"] == 1.0).all()
    assert frame["identical"].all() and frame["valid"].all()
    assert spec_metrics(frame) == {
        f"{key}_c{c}": value for c in (1, 4) for key, value in (
            ("speedup", 1.0), ("speedup_low", 1.0), ("speedup_high", 1.0),
            ("predicted_speedup", 1.0), ("acceptance_rate", 0.0),
            ("mean_acceptance_length", 1.0))}


def test_scaling_row_takes_medians_per_side() -> None:
    result = SimpleNamespace(runs=[
        _run(None, 0, {"output_throughput": 100.0, "p95_ttft_ms": 50.0}),
        _run(2, 0, {"output_throughput": 150.0, "p95_ttft_ms": 40.0}, valid=False),
        _run(None, 1, {"output_throughput": 120.0, "p95_ttft_ms": 70.0}),
        _run(2, 1, {}, error="RuntimeError: boom"),
        _run(2, 2, {"output_throughput": 170.0, "p95_ttft_ms": 60.0})])
    assert scaling_row(result, 2) == {
        "num_replicas": 2, "throughput_1": 110.0, "p95_ttft_ms_1": 60.0, "valid_1": True,
        "throughput_n": 160.0, "p95_ttft_ms_2": 50.0, "valid_2": False,
        "scaling_efficiency": pytest.approx(160.0 / 220.0)}
    with pytest.raises(RuntimeError, match="every 2-replica run failed"):
        scaling_row(SimpleNamespace(runs=result.runs[:1]), 2)


def test_tier_run_rows_label_the_runs_by_config() -> None:
    tier = host_tier(1 << 20)
    kv = {"median_ttft_ms": 10.0, "p95_ttft_ms": 20.0, "completed": 12, "duration": 3.0,
          "engine_time_s": 2.5, "kv_load_bytes": 2e6, "kv_store_bytes": 3e6,
          "external_prefix_cache_hit_rate": 0.25, "prefix_cache_hit_rate": 0.5}
    result = SimpleNamespace(runs=[
        _run(None, 0, {"median_ttft_ms": 30.0, "p95_ttft_ms": 40.0, "completed": 12,
                       "duration": 4.0}),
        _run(dict(tier), 0, kv, valid=False)])
    rows = run_rows(result, {"off": None, "host tier": tier})
    assert list(rows["config"]) == ["off", "host tier"] and list(rows["valid"]) == [True, False]
    off, on = rows.iloc[0], rows.iloc[1]
    assert off["external_prefix_cache_hit_rate"] == 0.0 and off["kv_load_mb"] == 0.0
    assert (on["p50_ttft_ms"], on["kv_load_mb"], on["kv_store_mb"]) == (10.0, 2.0, 3.0)
    assert (on["engine_time_s"], on["duration_s"]) == (2.5, 3.0)
    assert set(TIER_COLUMNS) <= set(rows.columns)


def test_quality_reference_row_is_the_reference_against_itself() -> None:
    rep = QualityReport("m", {}, {"quantization": "int8"}, 2, 8, 0.75, [None, 3], 1,
                        mean_kl=0.01, max_kl=0.1, top1_agreement=0.9, ppl_tokens=64,
                        reference_perplexity=4.0, perplexity=4.2, text_top1_agreement=0.95)
    row = _reference_row(rep, "full")
    assert row == {"variant": "full", "perplexity": 4.0, "ppl_increase_pct": 0.0,
                   "mean_kl": 0.0, "max_kl": 0.0, "top1_agreement": 1.0,
                   "text_top1_agreement": 1.0, "token_agreement": 1.0,
                   "identical_sequences": "2/2", "first_divergence": [None, None],
                   "quality_reference": "full", "gate": "reference", "gate_reasons": ""}
    group = QuantGroup("weights", "quantization", {"int8": "int8", "int4": "int4"})
    assert (_label(group, None), _label(group, "int4")) == ("full", "int4")
