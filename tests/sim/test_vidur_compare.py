"""The Vidur comparison without Vidur: our workload and scheduler as Vidur's CLI arguments
(exact, vidur 0.0.26's names), the trace it replays, a checkout's profiles staged as the
datasets Vidur reads offline, Vidur's request_metrics.csv and mlp.csv read from fixtures
written here in its format (tests/sim/fixtures/vidur/), our side's wiring on one request."""

from __future__ import annotations

import csv
import io
import json
import lzma
import re
from pathlib import Path

import pytest

from workbench.harness.arrivals import ArrivalSpec, arrival_offsets
from workbench.sim.batch import BatchComposition
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.model_shapes import model_shape
from workbench.sim.vidur_data import missing_profile_files, stage_profiles
from workbench.sim.vidur_operators import (
    ELEMENTWISE,
    operator_table,
    our_operator_ms,
    vidur_operator_ms,
)
from workbench.sim.vidur_peer import (
    LatencySummary,
    VidurCompareConfig,
    comparison_table,
    find_request_metrics,
    our_configs,
    parse_request_metrics,
    simulate_ours,
    trace_csv,
    vidur_args,
)

FIXTURES = Path(__file__).parent / "fixtures" / "vidur"
A100_FLOPS = 312e12 * 0.6  # the A100 profile's effective FLOP/s and bytes/s
A100_BYTES = 2039e9 * 0.8


def _cfg(**kw: object) -> VidurCompareConfig:
    base: dict[str, object] = dict(num_requests=4, qps=2.0, prompt_tokens=100,
                                   decode_tokens=10, seed=3, max_num_seqs=8)
    return VidurCompareConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_vidur_args_vllm_exact() -> None:
    args = vidur_args(_cfg(), Path("/w/trace.csv"), Path("/w/out"), Path("/w/cache"),
                      num_blocks=6000)
    rf = "--random_forrest_execution_time_predictor_config"
    assert args == [
        "--seed", "3",
        "--cluster_config_num_replicas", "1",
        "--replica_config_model_name", "meta-llama/Llama-2-7b-hf",
        "--replica_config_device", "a100",
        "--replica_config_network_device", "a100_pairwise_nvlink",
        "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--cache_config_block_size", "16",
        "--cache_config_num_blocks", "6000",
        "--cache_config_watermark_blocks_fraction", "0.0",
        "--global_scheduler_config_type", "round_robin",
        "--replica_scheduler_config_type", "vllm",
        "--vllm_scheduler_config_batch_size_cap", "8",
        "--vllm_scheduler_config_max_tokens_in_batch", "4096",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", "/w/trace.csv",
        "--trace_request_generator_config_max_tokens", "4096",
        "--trace_request_generator_config_date", "2023-08-21",
        "--trace_request_generator_config_prefill_scale_factor", "1",
        "--trace_request_generator_config_decode_scale_factor", "1",
        "--trace_request_generator_config_time_scale_factor", "1",
        "--execution_time_predictor_config_type", "random_forrest",
        f"{rf}_model_profiling_dataset", "workbench-local/vidur-meta-llama-llama-2-7b-hf-a100",
        f"{rf}_network_profiling_dataset", "workbench-local/vidur-a100_pairwise_nvlink",
        f"{rf}_cache_dir", "/w/cache",
        f"{rf}_prediction_max_prefill_chunk_size", "4096",
        f"{rf}_prediction_max_batch_size", "8",
        f"{rf}_prediction_max_tokens_per_request", "4096",
        "--metrics_config_output_dir", "/w/out",
        "--no-cache_config_enable_prefix_caching",
        "--no-metrics_config_store_plots",
        "--no-metrics_config_enable_chrome_trace",
    ]


def test_sarathi_on_h100_changes_only_its_arguments() -> None:
    base = vidur_args(_cfg(), Path("t"), Path("o"), Path("c"), 6000)
    cfg = _cfg(scheduler="sarathi", hardware="H100-SXM", max_num_batched_tokens=512,
               predictor="linear_regression")
    args = vidur_args(cfg, Path("t"), Path("o"), Path("c"), 6000)
    changed = {(a, b) for a, b in zip(args[::2], args[1::2], strict=False)} - \
        {(a, b) for a, b in zip(base[::2], base[1::2], strict=False)}
    lr = "--linear_regression_execution_time_predictor_config"
    assert changed == {
        ("--replica_config_device", "h100"),
        ("--replica_config_network_device", "h100_pairwise_nvlink"),
        ("--replica_scheduler_config_type", "sarathi"),
        ("--sarathi_scheduler_config_batch_size_cap", "8"),
        ("--sarathi_scheduler_config_chunk_size", "512"),
        ("--execution_time_predictor_config_type", "linear_regression"),
        (f"{lr}_model_profiling_dataset", "workbench-local/vidur-meta-llama-llama-2-7b-hf-h100"),
        (f"{lr}_network_profiling_dataset", "workbench-local/vidur-h100_pairwise_nvlink"),
        (f"{lr}_cache_dir", "c"),
        (f"{lr}_prediction_max_prefill_chunk_size", "512"),
        (f"{lr}_prediction_max_batch_size", "8"),
        (f"{lr}_prediction_max_tokens_per_request", "4096"),
    }


def test_our_configs_match_vidurs_scheduler() -> None:
    sc, cc = our_configs(_cfg())
    assert (sc.max_num_seqs, sc.max_num_batched_tokens, sc.enable_chunked_prefill,
            sc.max_model_len) == (8, 4096, False, 4096)
    assert (cc.block_size, cc.enable_prefix_caching) == (16, False)
    sc, _ = our_configs(_cfg(scheduler="sarathi", max_num_batched_tokens=512))
    assert (sc.max_num_batched_tokens, sc.enable_chunked_prefill) == (512, True)


def test_trace_is_the_harness_poisson_schedule() -> None:
    rows = list(csv.reader(io.StringIO(trace_csv(_cfg()))))
    assert rows[0] == ["Date", "Time", "PromptTokenCount", "CompletionTokenCount"]
    expected = arrival_offsets(ArrivalSpec(mode="poisson", rate=2.0, seed=3), 4)
    assert expected is not None and expected[0] == 0.0
    assert [float(r[1]) for r in rows[1:]] == expected  # repr round-trips exactly
    assert [[r[0], *r[2:]] for r in rows[1:]] == [["2023-08-21", "100", "10"]] * 4


@pytest.mark.parametrize(("kw", "field"), [
    ({"model": "Qwen3-32B"}, "model ('Qwen3-32B')"),
    ({"hardware": "L40S"}, "hardware ('L40S')"),
    ({"scheduler": "orca"}, "scheduler ('orca')"),
    ({"decode_tokens": 1}, "decode_tokens (1) must be an integer >= 2"),
    ({"qps": 0}, "qps (0) must be finite and > 0"),
    ({"prompt_tokens": 4000, "decode_tokens": 100}, "prompt_tokens + decode_tokens (4100)"),
])
def test_bad_config_names_the_field(kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"VidurCompareConfig {field}")):
        _cfg(**kw)


def _checkout(root: Path, skip: tuple[str, ...] = ()) -> None:
    for rel, text in (("compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv", "mlp\n"),
                      ("compute/a100/meta-llama/Llama-2-7b-hf/attention.csv", "attn\n"),
                      ("network/a100_pairwise_nvlink/all_reduce.csv", "ar\n"),
                      ("network/a100_pairwise_nvlink/send_recv.csv", "sr\n")):
        if rel.split("/")[-1] not in skip:
            (root / "profiling" / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "profiling" / rel).write_text(text)


def test_missing_profile_files(tmp_path: Path) -> None:
    _checkout(tmp_path, skip=("attention.csv", "all_reduce.csv"))
    compute = tmp_path / "profiling/compute/a100/meta-llama/Llama-2-7b-hf"
    network = tmp_path / "profiling/network/a100_pairwise_nvlink"
    assert missing_profile_files(_cfg(), tmp_path) == [compute / "attention.csv",
                                                       network / "all_reduce.csv"]
    with pytest.raises(FileNotFoundError, match="attention.csv"):
        stage_profiles(_cfg(), tmp_path, tmp_path / "cache")


def test_stage_profiles_in_the_hub_cache_layout(tmp_path: Path) -> None:
    _checkout(tmp_path / "data")
    compute, network = stage_profiles(_cfg(), tmp_path / "data", tmp_path / "cache")
    base = tmp_path / "cache/profiling_data"
    repo = base / "compute/datasets--workbench-local--vidur-meta-llama-llama-2-7b-hf-a100"
    assert compute == repo / "snapshots/local"
    assert (repo / "refs/main").read_text() == "local"
    assert network == base / "network/datasets--workbench-local--vidur-a100_pairwise_nvlink" \
        / "snapshots/local"
    assert json.loads((compute / "config.json").read_text()) == {
        "model": "meta-llama/Llama-2-7b-hf", "device_sku": "a100"}
    assert json.loads((network / "config.json").read_text()) == {"sku": "a100_pairwise_nvlink"}
    got = {p.relative_to(tmp_path / "cache").as_posix(): lzma.decompress(p.read_bytes())
           for p in sorted((tmp_path / "cache").rglob("*.csv.xz"))}
    assert sorted(got.values()) == [b"ar\n", b"attn\n", b"mlp\n", b"sr\n"]
    assert {k.split("/")[-1] for k in got} == {"mlp.csv.xz", "attention.csv.xz",
                                                "all_reduce.csv.xz", "send_recv.csv.xz"}


def test_parse_request_metrics_fixture() -> None:
    got = parse_request_metrics((FIXTURES / "request_metrics.csv").read_text())
    # TTFT 0.1 0.3 0.2 0.5 s; TPOT (e2e - ttft) / (decode - 1): 1.9/100, 2.2/100, 2.8/50, 1/10
    assert got.num_requests == 4
    assert got.median_ttft_ms == pytest.approx(250.0)
    assert got.p95_ttft_ms == pytest.approx(470.0)  # 0.3 + 0.85 x (0.5 - 0.3), linear
    assert got.median_tpot_ms == pytest.approx(39.0)  # (22 + 56) / 2


def test_parse_request_metrics_refusals() -> None:
    with pytest.raises(ValueError, match="lack column.* prefill_e2e_time"):
        parse_request_metrics("Request Id,request_e2e_time,request_num_decode_tokens\n0,1,2\n")
    head = "Request Id,request_e2e_time,prefill_e2e_time,request_num_decode_tokens\n"
    with pytest.raises(ValueError, match="Vidur request 7: need decode tokens >= 2"):
        parse_request_metrics(head + "7,1.0,0.5,1\n")
    with pytest.raises(ValueError, match="hold no request"):
        parse_request_metrics(head)


def test_find_request_metrics(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="found 0"):
        find_request_metrics(tmp_path)
    run = tmp_path / "2026-12-05_10-00-00-000000"
    run.mkdir()
    (run / "request_metrics.csv").write_text("x\n")
    assert find_request_metrics(tmp_path) == run / "request_metrics.csv"


def test_comparison_table() -> None:
    ours = LatencySummary(4, 100.0, 300.0, 20.0)
    theirs = LatencySummary(4, 80.0, 200.0, 25.0)
    assert comparison_table(ours, theirs).splitlines()[2:] == [
        "| median TTFT (ms) | 100.00 | 80.00 | 1.25 |",
        "| p95 TTFT (ms) | 300.00 | 200.00 | 1.50 |",
        "| median TPOT (ms) | 20.00 | 25.00 | 0.80 |",
    ]


def _gemm_ms(m: int, k: int, n: int) -> float:
    """docs/simulator_cost_model.md's GEMM on the A100 profile, bf16."""
    return max(2 * m * k * n / A100_FLOPS, (k * n * 2 + (m * k + m * n) * 2) / A100_BYTES) * 1e3


def test_operators_from_vidurs_mlp_csv_fixture() -> None:
    shape = model_shape("Llama-2-7B")
    theirs = vidur_operator_ms((FIXTURES / "mlp.csv").read_text(), shape, [1, 512])
    # the tp-2 row and the other shape's row are skipped; 512's two rows give their median
    assert theirs[1] == pytest.approx({"qkv_proj": 0.065, "o_proj": 0.025, "gate_up_proj": 0.116,
                                       "down_proj": 0.06, ELEMENTWISE: 0.024})
    assert theirs[512] == pytest.approx({"qkv_proj": 0.235, "o_proj": 0.089,
                                         "gate_up_proj": 0.403, "down_proj": 0.230,
                                         ELEMENTWISE: 0.0895})
    with pytest.raises(ValueError, match=r"no row for Llama-2-7B at num_tokens \[16\]"):
        vidur_operator_ms((FIXTURES / "mlp.csv").read_text(), shape, [1, 16])

    ours = our_operator_ms(AnalyticCostModel(shape, "A100-80GB-SXM"), [1, 512])
    for m in (1, 512):
        assert ours[m] == pytest.approx({"qkv_proj": _gemm_ms(m, 4096, 12288),
                                         "o_proj": _gemm_ms(m, 4096, 4096),
                                         "gate_up_proj": _gemm_ms(m, 4096, 22016),
                                         "down_proj": _gemm_ms(m, 11008, 4096)}, rel=1e-12)
    table = operator_table(ours, theirs).splitlines()
    assert table[2] == f"| 1 | qkv_proj | {ours[1]['qkv_proj']:.4f} | 0.0650 | " \
                       f"{ours[1]['qkv_proj'] / 0.065:.2f} |"
    assert table[6] == f"| 1 | {ELEMENTWISE} | - | 0.0240 | - |"


def test_our_side_on_one_request_is_the_cost_models_steps() -> None:
    cfg = _cfg(num_requests=1, prompt_tokens=100, decode_tokens=3)
    got = simulate_ours(cfg, num_blocks=64)
    cost = AnalyticCostModel("Llama-2-7B", "A100-80GB-SXM")
    prefill = cost.step_time_s(BatchComposition(prefill_tokens=100, prefill_attn_pairs=5050,
                                                num_seqs=1, sampled_rows=1))
    decodes = [cost.step_time_s(BatchComposition(decode_tokens=1, decode_context_tokens=ctx,
                                                 num_seqs=1, sampled_rows=1))
               for ctx in (101, 102)]
    assert got.num_requests == 1
    assert got.median_ttft_ms == pytest.approx(prefill * 1e3, rel=1e-12)
    assert got.p95_ttft_ms == pytest.approx(prefill * 1e3, rel=1e-12)
    assert got.median_tpot_ms == pytest.approx(sum(decodes) / 2 * 1e3, rel=1e-12)
