"""The schedule-aware roofline (workbench.planning.roofline, planning.schedule_roofline, `workbench
calc roofline`), the start/end check of the machine's figures (bench/roofline.py), and the
offline benchmark's refusals: a refused roofline, INVALID systems whose medians leave their
disturbed runs out, the vLLM rows' preload; the engine's overhead share (its step account
over the timed calls). Exact expectations, nothing timed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workbench import planning as calc
from workbench.bench.micro.roofline import MachineRates, check_machine, measure_machine
from workbench.bench.offline import throughput as offline
from workbench.bench.offline.results import (
    NO_FIGURE,
    RunPolicy,
    SystemResult,
    judge,
    record_steps,
    table,
    timed,
    timed_step_account,
)
from workbench.bench.offline.throughput import vllm_system
from workbench.harness.offline_workload import OfflineRequest
from workbench.harness.validity import FixedCpuWatch
from workbench.planning.cli import main as calc_main
from workbench.planning.roofline import (
    Chunk,
    DecoderShape,
    RooflineInputError,
    ScheduleConfig,
    request_flops,
    schedule_roofline,
    simulate_schedule,
)

# hidden 4, 1 layer, 1 head of dim 4, MLP 8, vocab 16: 160 matmul params in the layer
# (q, k, v, o: 4 x 16; gate, up, down: 3 x 32), 64 in the lm_head; KV 2 x 4 = 8 elements/token
TOY = DecoderShape(hidden_size=4, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4,
                   intermediate_size=8, vocab_size=16)
# A (prompt 3, 2 out), B (2, 3), C (4, 1) under a budget of 4 tokens and 2 seats
TOY_REQUESTS = [(3, 2), (2, 3), (4, 1)]


def test_toy_shape() -> None:
    assert (TOY.layer_matmul_params, TOY.lm_head_params, TOY.kv_bytes_per_token(2)) == (
        160, 64, 16.0)


def test_the_schedule_is_the_engines_decodes_first_then_chunks_filling_the_budget() -> None:
    steps = simulate_schedule(TOY_REQUESTS, ScheduleConfig(max_num_batched_tokens=4,
                                                           max_num_seqs=2))
    assert steps == [
        # A's whole prompt (samples its first token); B gets the 1 token left (a chunk)
        (Chunk(0, 0, 3, False, True), Chunk(1, 0, 1, False, False)),
        # A decodes (and finishes); B's last prompt token samples; C waits: 2 seats taken
        (Chunk(0, 3, 1, True, True), Chunk(1, 1, 1, False, True)),
        # A left: B decodes, C is admitted with the 3 tokens the budget leaves
        (Chunk(1, 2, 1, True, True), Chunk(2, 0, 3, False, False)),
        # B's last decode; C's last prompt token samples its only output token
        (Chunk(1, 3, 1, True, True), Chunk(2, 3, 1, False, True)),
    ]


def test_toy_step_costs_by_hand() -> None:
    # 2 GFLOP/s, 1 GB/s; weights 2 bytes: 320 B of layer + 128 B of lm_head per sampling step
    r = schedule_roofline(TOY, TOY_REQUESTS, 4, 2, gflops=2, bandwidth_gbs=1, dtype_bytes=2)
    # FLOPs: linear 2 x 160 x tokens + lm_head 2 x 64 x samples + attention 4 x 1 x 4 x keys
    # step 1: 4 tokens, 1 sample, keys 6 (A: 1+2+3) + 1 (B) = 7 -> 1280 + 128 + 112
    # step 2: 2 tokens, 2 samples, keys 4 (A at 3) + 2 (B at 1) -> 640 + 256 + 96
    # step 3: 4 tokens, 1 sample, keys 3 (B at 2) + 6 (C) -> 1280 + 128 + 144
    # step 4: 2 tokens, 2 samples, keys 4 + 4 -> 640 + 256 + 128
    assert [s.flops for s in r.steps] == [1520, 992, 1552, 1024]
    assert [(s.linear_flops, s.lm_head_flops, s.attention_flops) for s in r.steps] == [
        (1280, 128, 112), (640, 256, 96), (1280, 128, 144), (640, 256, 128)]
    # bytes: 448 of weights + 16 x tokens read before each chunk + 16 x tokens written
    assert [(s.kv_read_bytes, s.kv_write_bytes) for s in r.steps] == [
        (0, 64), (16 * (3 + 1), 32), (16 * 2, 64), (16 * (3 + 3), 32)]
    assert [s.bytes for s in r.steps] == [512, 544, 544, 576]
    assert [(s.num_decodes, s.num_prefill_tokens, s.num_samples) for s in r.steps] == [
        (0, 4, 1), (1, 1, 2), (1, 3, 1), (1, 1, 2)]
    # compute ns = FLOPs / 2, memory ns = bytes / 1
    assert [s.bound for s in r.steps] == ["compute", "bandwidth", "compute", "bandwidth"]
    assert [round(s.seconds * 1e9, 6) for s in r.steps] == [760, 544, 776, 576]
    assert (r.compute_bound_steps, r.bandwidth_bound_steps) == (2, 2)
    assert r.seconds == pytest.approx(2656e-9, rel=1e-12)
    assert (r.prompt_tokens, r.output_tokens) == (9, 6)
    assert r.output_tok_s == pytest.approx(6 / 2656e-9, rel=1e-12)
    assert r.compute_only_output_tok_s == pytest.approx(6 / (5088 / 2e9), rel=1e-12)
    assert r.fraction(r.output_tok_s / 4) == pytest.approx(0.25)
    # the schedule moves FLOPs between steps, never adds any
    assert r.total_flops == sum(request_flops(TOY, p, t) for p, t in TOY_REQUESTS) == 5088
    doc = r.to_dict(with_steps=True)
    assert doc["num_steps"] == 4 and doc["steps"][1]["bound"] == "bandwidth"
    assert calc.schedule_roofline is schedule_roofline  # calc exposes it


def test_a_tie_is_compute_bound_and_the_lm_head_is_read_only_when_sampling() -> None:
    # (3, 1): 960 + 128 + 96 = 1184 FLOPs at 74 GFLOP/s = 16 ns = 448 + 48 = 496 B at 31 GB/s
    r = schedule_roofline(TOY, [(3, 1)], 4, 1, gflops=74, bandwidth_gbs=31, dtype_bytes=2)
    assert (r.steps[0].flops, r.steps[0].bytes) == (1184, 496)
    assert len(r.steps) == 1 and r.steps[0].compute_s == r.steps[0].memory_s
    assert r.steps[0].bound == "compute"
    # a 6-token prompt under a budget of 4: the first chunk samples nothing, reads no lm_head
    r = schedule_roofline(TOY, [(6, 1)], 4, 1, gflops=1, bandwidth_gbs=1, dtype_bytes=2)
    assert [(s.num_samples, s.weight_bytes, s.lm_head_flops) for s in r.steps] == [
        (0, 320, 0), (1, 448, 128)]


def test_knobs_chunked_prefill_off_threshold_and_seats() -> None:
    # chunked prefill off: B (prompt 2) does not fit the 1 token left, it waits a step
    steps = simulate_schedule(TOY_REQUESTS, ScheduleConfig(4, 2, enable_chunked_prefill=False))
    assert steps[0] == (Chunk(0, 0, 3, False, True),)
    assert steps[1] == (Chunk(0, 3, 1, True, True), Chunk(1, 0, 2, False, True))
    # a threshold of 2 caps every prefill chunk
    steps = simulate_schedule([(5, 1)], ScheduleConfig(8, 1, long_prefill_token_threshold=2))
    assert [c.num_new for s in steps for c in s] == [2, 2, 1]
    # one seat: requests run one after the other, P chunks + (T - 1) decodes each
    steps = simulate_schedule([(2, 3), (2, 2)], ScheduleConfig(8, 1))
    assert [[(c.request, c.num_new) for c in s] for s in steps] == [
        [(0, 2)], [(0, 1)], [(0, 1)], [(1, 2)], [(1, 1)]]
    assert calc.forward_passes(2, 3, 8) == 3  # the same count for one request alone


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"max_num_batched_tokens": 2, "max_num_seqs": 4},
     "max_num_batched_tokens (2) must be >= max_num_seqs (4); raise it or lower max_num_seqs"),
    ({"gflops": 0}, "gflops must be a finite number > 0, got 0"),
    ({"bandwidth_gbs": float("inf")}, "bandwidth_gbs must be a finite number > 0, got inf"),
    ({"requests": [(3, 0)]}, "requests[0] max_tokens must be an integer >= 1, got 0"),
    ({"requests": []}, "requests must hold at least one"),
    ({"enable_chunked_prefill": False, "requests": [(9, 1)]},
     "a prompt of 9 tokens never fits max_num_batched_tokens (4) with chunked prefill off"),
])
def test_bad_arguments_are_named(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {"model": TOY, "requests": TOY_REQUESTS, "max_num_batched_tokens": 4,
                            "max_num_seqs": 2, "gflops": 1.0, "bandwidth_gbs": 1.0, **kwargs}
    with pytest.raises(RooflineInputError) as e:
        schedule_roofline(**args)
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)


def test_the_model_may_be_an_hf_config_or_a_checkpoint(tmp_path: Path) -> None:
    cfg = {"hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
           "head_dim": 4, "intermediate_size": 8, "vocab_size": 16}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = schedule_roofline(cfg, TOY_REQUESTS, 4, 2, 2, 1, 2)
    b = schedule_roofline(tmp_path, TOY_REQUESTS, 4, 2, 2, 1, 2)
    assert a.steps == b.steps == schedule_roofline(TOY, TOY_REQUESTS, 4, 2, 2, 1, 2).steps


def test_cli_roofline(capsys: pytest.CaptureFixture[str]) -> None:
    calc_main(["roofline", "--requests", "3:2", "2:3", "4:1", "--hidden", "4", "--layers",
               "1", "--heads", "1", "--intermediate", "8", "--vocab", "16", "--gflops", "2",
               "--bandwidth", "1GB", "--max-num-batched-tokens", "4", "--max-num-seqs", "2",
               "--steps"])
    out = capsys.readouterr().out.splitlines()
    assert out[2] == ("| 0 | 0 | 4 | 1 | 0.0 | 0.00 | 0.0008 | 0.0005 | compute |")
    rows = {key: value.strip() for key, value in (line.split("  ", 1) for line in out[7:])}
    assert rows["engine steps"] == "4"
    assert rows["compute-bound steps"] == "2" and rows["bandwidth-bound steps"] == "2"
    assert rows["output tok/s bound"] == "2,259,036.1446"  # 6 tokens / 2656 ns


def test_cli_roofline_expands_counts_and_refuses_bad_input(
        capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.planning.commands import parse_requests

    assert parse_requests(["128:64", "32:16x3"]) == [(128, 64)] + [(32, 16)] * 3
    with pytest.raises(SystemExit) as e:
        calc_main(["roofline", "--requests", "3:2", "--gflops", "1", "--bandwidth", "1GB"])
    assert e.value.code == 2
    assert "give --config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        calc_main(["roofline", "--requests", "3:2", "--hidden", "4", "--layers", "1", "--heads",
                   "1", "--intermediate", "8", "--vocab", "16", "--gflops", "1",
                   "--bandwidth", "1GB", "--max-num-batched-tokens", "1", "--max-num-seqs", "2"])
    assert capsys.readouterr().err == (
        "workbench calc roofline: max_num_batched_tokens (1) must be >= max_num_seqs (2); "
        "raise it or lower max_num_seqs\n")


# ------------------------------------------------------------------ the machine, start vs end
def rates(g: float, b: float, others: float = 0.0, **kw: bool) -> MachineRates:
    return MachineRates(gflops=g, bandwidth_gbs=b, others_cpu=others, **kw)


def test_start_and_end_within_10_percent_give_the_best_of_both() -> None:
    check = check_machine(rates(100, 20), rates(109, 21.9))
    assert check.valid and check.reason == ""
    assert (check.gflops, check.bandwidth_gbs) == (109, 21.9)
    assert check.to_dict()["start"] == {"gflops": 100, "bandwidth_gbs": 20, "gflops_stated": False,
                                        "bandwidth_stated": False, "others_cpu": 0.0,
                                        "redone": 0}


def test_a_drift_above_10_percent_refuses_the_roofline() -> None:
    check = check_machine(rates(100, 20), rates(111, 20))
    assert not check.valid
    assert check.reasons == ("fp32 GFLOP/s moved 11% between start (100.0) and end (111.0), "
                             "more than 10%: the machine changed under the benchmark",)
    check = check_machine(rates(100, 25), rates(100, 20))  # 25 / 20 - 1 = 25%
    assert check.reason.startswith("memory bandwidth moved 25% between start (25.0 GB/s) and "
                                   "end (20.0 GB/s)")
    check = check_machine(rates(100, 20, others=0.3), rates(100, 20))
    assert check.reasons == ("other processes used 30% of the CPUs while the machine was "
                             "measured at the start (threshold 15%)",)
    # a stated figure is not measured, so not checked
    stated = {"gflops_stated": True}
    assert check_machine(rates(100, 20, **stated), rates(150, 20, **stated)).valid


def test_measure_machine_redoes_a_disturbed_measurement() -> None:
    figures = iter([(100.0, 20.0), (120.0, 22.0)])
    pair: list[float] = []

    def g() -> float:
        pair[:] = next(figures)
        return pair[0]

    watch = FixedCpuWatch(0.5, 0.05)
    r = measure_machine(max_others=0.15, retries=2, watch=watch, measure_gflops=g,
                        measure_bandwidth=lambda: pair[1])
    assert (r.gflops, r.bandwidth_gbs, r.others_cpu, r.redone) == (120, 22, 0.05, 1)
    r = measure_machine(bandwidth_gbs=30, watch=FixedCpuWatch(0.9), retries=1,
                        measure_gflops=lambda: 50.0)  # still disturbed: kept, marked
    assert (r.gflops, r.bandwidth_gbs, r.bandwidth_stated, r.others_cpu, r.redone) == (
        50, 30, True, 0.9, 1)


# ------------------------------------------------------------------ the offline table and JSON
def system(name: str, run_s: list[float], shares: list[float]) -> SystemResult:
    return SystemResult(name=name, run_s=run_s, single_run_s=[1.0] * len(run_s),
                        output_tokens=100, total_tokens=200, single_tokens=10,
                        others_cpu=max(shares), run_others=shares,
                        single_run_others=[0.0] * len(run_s),
                        mismatches=0, token_ids=[[1]])


def test_timed_keeps_a_disturbed_run_marked_when_the_retries_run_out() -> None:
    watch = FixedCpuWatch(0.5, 0.1, 0.3, 0.2)  # one retry: 0.5 redone, 0.3 and 0.2 kept
    runs = timed(lambda: [[1]], RunPolicy(runs=3, max_others=0.15, retries=1, watch=watch))
    assert runs.others == [0.1, 0.3, 0.2] and runs.redone == 1 and runs.worst == 0.3


def test_medians_leave_disturbed_runs_out_and_the_row_is_invalid() -> None:
    engine = system("engine", [1.0, 1.0, 1.0], [0.0, 0.0, 0.0])
    hf = system("hf-generate", [1.0, 9.0, 4.0], [0.05, 0.30, 0.10])  # 9 s run disturbed
    gone = system("hf-generate_batch", [2.0, 2.0], [0.5, 0.4])  # no undisturbed run
    lines = judge([engine, hf, gone], 0.15)
    assert lines == [
        "INVALID system hf-generate: other processes used 30% of the CPUs (threshold 15%); "
        "not used for any result (the table shows the median of its 2 undisturbed runs)",
        "INVALID system hf-generate_batch: other processes used 50% of the CPUs (threshold "
        "15%); not used for any result (no undisturbed run: no figure)"]
    assert hf.clean_run_s == [1.0, 4.0] and hf.output_tok_s == 100 / 2.5
    assert gone.clean_run_s == [] and gone.disturbed_runs == 2
    rows = table([engine, hf, gone], roofline_tok_s=1000.0).splitlines()
    assert rows[2] == ("| engine | 100.0 | 200.0 | 100.00 | 1.00x | 10.0% | 0/1 | 0% | "
                       f"{NO_FIGURE} |")
    assert rows[3] == ("| hf-generate | 40.0 | 80.0 | 100.00 | n/a (invalid) | 4.0% | 0/1 | "
                       f"30% INVALID | {NO_FIGURE} |")
    assert rows[4] == (f"| hf-generate_batch | {NO_FIGURE} | {NO_FIGURE} | 100.00 | "
                       f"n/a (invalid) | {NO_FIGURE} | 0/1 | 50% INVALID | {NO_FIGURE} |")
    doc = gone.to_json()
    assert (doc["valid"], doc["output_tok_s"], doc["total_tok_s"], doc["median_of_runs"],
            doc["disturbed_runs"]) == (False, None, None, 0, 2)
    assert doc["invalid_reason"].startswith("other processes used 50% of the CPUs")
    assert hf.to_json()["output_tok_s"] == 40.0
    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN left


def test_a_refused_roofline_prints_no_fraction() -> None:
    rows = table([system("engine", [1.0], [0.0])], roofline_tok_s=None).splitlines()
    assert rows[2] == ("| engine | 100.0 | 200.0 | 100.00 | 1.00x | n/a (roofline invalid) | "
                       f"0/1 | 0% | {NO_FIGURE} |")


ACCOUNT = {"num_steps": 4, "step_ms": 250.0, "forward_ms": 125.0, "overhead_share": 0.125}


def test_the_engine_row_shows_its_overhead_share_and_the_json_its_account() -> None:
    engine, hf = system("engine", [1.0], [0.0]), system("hf-generate", [1.0], [0.0])
    engine.step_account = dict(ACCOUNT)
    rows = table([engine, hf], roofline_tok_s=None).splitlines()
    assert rows[0].endswith("| mismatches | others' CPU | overhead share |")
    assert rows[1] == "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    assert rows[2].endswith("| 0/1 | 0% | 12.5% |")
    assert rows[3].endswith(f"| 0/1 | 0% | {NO_FIGURE} |")
    assert engine.to_json()["step_account"] == ACCOUNT and hf.to_json()["step_account"] is None
    engine.step_account = {"num_steps": 0, "overhead_share": 0.0}  # no step recorded
    assert table([engine], None).splitlines()[2].endswith(f"| 0% | {NO_FIGURE} |")


def test_the_engine_account_covers_its_timed_calls_and_not_the_warm_up() -> None:
    from workbench.metrics.stats import EngineStats, StepRecord

    stats = EngineStats()
    calls_steps = iter([[4.0], [0.5, 0.25], [0.125, 0.125]])  # warm-up, then 2 timed calls

    def generate() -> list[list[int]]:
        for d in next(calls_steps):
            stats.record_step(StepRecord(
                step=0, wall_time_s=0.0, duration_s=d, prefill_tokens=0, decode_tokens=1,
                running=1, waiting=0, kv_cache_usage_perc=0.0, preemptions=0,
                prepare_inputs_s=d / 4, forward_s=d / 2, other_s=d / 4))
        return [[1]]

    calls: list[list[StepRecord]] = []
    policy = RunPolicy(runs=2, watch=FixedCpuWatch(0.0))
    assert timed(record_steps(stats, generate, calls), policy).out == [[1]]
    assert [[r.duration_s for r in c] for c in calls] == [[4.0], [0.5, 0.25], [0.125, 0.125]]
    acc = timed_step_account(calls)
    assert (acc["num_steps"], acc["step_ms"], acc["prepare_inputs_ms"], acc["forward_ms"],
            acc["other_ms"], acc["schedule_ms"]) == (4, 250.0, 62.5, 125.0, 62.5, 0.0)
    assert (acc["overhead_share"], acc["prepare_inputs_share"], acc["forward_share"]) == (
        0.5, 0.25, 0.5)


def vllm_result(**extra: Any) -> SimpleNamespace:
    return SimpleNamespace(run_s=[2.0, 1.0], single_run_s=[1.0], token_ids=[[1]], load_s=3.0,
                           version="0.32.0", others_cpu=0.4,
                           env={"LD_PRELOAD": "/x/libtcmalloc.so", "VLLM_CPU_KVCACHE_SPACE": "2"},
                           **extra)


def test_vllm_rows_name_the_preload_and_keep_the_workers_clean_runs() -> None:
    reqs = [OfflineRequest([1, 2], 50), OfflineRequest([3], 50)]
    single = OfflineRequest([1], 10)
    best = vllm_system(vllm_result(preload="tcmalloc+iomp5"), "best", reqs, single)
    old = vllm_system(vllm_result(), "default", reqs, single)  # a result before the field
    assert (best.preload, old.preload) == ("tcmalloc+iomp5", "unknown")
    judge([best, old], 0.15)  # the worker's worst share 40%: INVALID, medians its clean runs
    assert not best.valid and best.output_tok_s == 100 / 1.5
    rows = table([best, old], roofline_tok_s=None).splitlines()
    assert rows[2].startswith("| vllm-best (preload: tcmalloc+iomp5) | 66.7 | 68.7 |")
    assert rows[3].startswith("| vllm-default (preload: unknown) |")
    assert best.to_json()["preload"] == "tcmalloc+iomp5"
    assert "LD_PRELOAD requested: /x/libtcmalloc.so" in best.notes


def test_main_writes_the_refusals_into_the_json(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 4,
        "intermediate_size": 8, "vocab_size": 300}))
    (ckpt / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": 0, "content": "<s>"}],
        "model": {"vocab": {f"t{i}": i for i in range(1, 300)}}}))
    machine = iter([rates(100, 20), rates(130, 20)])  # start, end: 30% apart
    monkeypatch.setattr(offline, "measure_machine", lambda **kw: next(machine))
    monkeypatch.setattr(offline, "build_bench_checkpoint", lambda d, config=None: ckpt)

    def fake_engine(ckpt: Path, reqs: list[OfflineRequest], single: OfflineRequest,
                    policy: RunPolicy, kw: dict[str, Any]) -> SystemResult:
        r = system("engine", [1.0, 3.0, 2.0], [0.0, 0.9, 0.0])
        r.token_ids = [[1]] * len(reqs)
        r.step_account = dict(ACCOUNT)
        return r

    monkeypatch.setattr(offline, "run_engine", fake_engine)
    out = tmp_path / "r.json"
    assert offline.main(["--num-requests", "4", "--skip-hf", "--skip-vllm", "--json",
                         str(out), "--strict"]) == 2
    doc = json.loads(out.read_text())
    assert doc["roofline_valid"] is False and doc["roofline_output_tok_s"] is None
    assert doc["roofline_invalid_reason"].startswith("fp32 GFLOP/s moved 30% between start")
    assert (doc["gflops"], doc["bandwidth_gbs"]) == (130, 20)
    assert doc["roofline"]["num_steps"] == len(doc["roofline"]["steps"]) > 0
    assert doc["roofline"]["max_num_batched_tokens"] == 8192
    (eng,) = doc["results"]
    assert (eng["valid"], eng["median_of_runs"], eng["disturbed_runs"]) == (False, 2, 1)
    assert eng["output_tok_s"] == 100 / 1.5  # median of 1 s and 2 s; the 3 s run disturbed
    assert eng["run_others"] == [0.0, 0.9, 0.0]
    assert eng["step_account"] == ACCOUNT  # the per-phase account, whole
