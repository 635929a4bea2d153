"""The offline benchmark's workload is fixed by its seed and stays inside its ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.harness.offline_workload import (
    NUM_REQUESTS,
    OUTPUT_LEN_RANGE,
    PROMPT_LEN_RANGE,
    checksum,
    make_offline_workload,
    non_special_token_range,
    workload_tokens,
)


def test_same_seed_same_workload() -> None:
    a, b = make_offline_workload(0), make_offline_workload(0)
    assert a == b
    assert checksum(a) == checksum(b)
    # Pinned: random.Random(0) draws; a change here changes every published figure.
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in a[:3]] == FIRST_THREE_SEED0
    assert workload_tokens(a) == (9003, 4558)
    assert checksum(a) == CHECKSUM_SEED0


def test_lengths_and_ids_in_range() -> None:
    reqs = make_offline_workload(3, token_range=(10, 100))
    assert len(reqs) == NUM_REQUESTS
    for r in reqs:
        assert PROMPT_LEN_RANGE[0] <= len(r.prompt_token_ids) <= PROMPT_LEN_RANGE[1]
        assert OUTPUT_LEN_RANGE[0] <= r.max_tokens <= OUTPUT_LEN_RANGE[1]
        assert all(10 <= t < 100 for t in r.prompt_token_ids)


def test_checksum_changes_with_seed_and_content() -> None:
    base = make_offline_workload(0)
    assert checksum(make_offline_workload(1)) != checksum(base)
    assert checksum(make_offline_workload(0, token_range=(16, 4096))) != checksum(base)
    assert checksum(base[:-1]) != checksum(base)


def test_bad_ranges_raise() -> None:
    with pytest.raises(ValueError, match="token_range"):
        make_offline_workload(0, token_range=(5, 5))
    with pytest.raises(ValueError, match="prompt_len_range"):
        make_offline_workload(0, prompt_len_range=(0, 4))


FIRST_THREE_SEED0 = [(248, 65), (37, 40), (98, 61)]
CHECKSUM_SEED0 = "b431cf28e403b31fbcda20d426baca47007746800059a91d4cae020fbd394449"


def test_non_special_token_range(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 300}))
    added = [{"id": i, "content": f"<s{i}>"} for i in (0, 1, 290, 291)]
    vocab = {f"t{i}": i for i in range(2, 290)}
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": added, "model": {"vocab": vocab}}))
    assert non_special_token_range(tmp_path) == (16, 290)


def test_mismatch_details_and_unstable_calls_are_reported() -> None:
    from workbench.bench.offline.throughput import RunPolicy, mismatch_details, timed
    from workbench.harness.validity import FixedCpuWatch

    ref = [[1, 2, 3], [4, 5], [6, 7, 8]]
    got = [[1, 2, 3], [4, 9], [6, 7]]
    assert mismatch_details(got, ref) == [
        {"request": 1, "position": 1, "got": 9, "want": 5},
        {"request": 2, "position": 2, "got": None, "want": 8}]
    assert mismatch_details(ref, ref) == []
    outputs = iter([[[1]], [[1]], [[2]], [[1]]])  # warm-up, then 3 timed calls: one differs
    quiet = RunPolicy(runs=3, max_others=0.15, watch=FixedCpuWatch(0.0))  # never redone
    runs = timed(lambda: next(outputs), quiet)
    assert len(runs.run_s) == 3 and runs.out == [[1]] and runs.unstable == 1
    assert runs.others == [0.0, 0.0, 0.0] and runs.worst == 0.0


def test_disturbed_runs_are_redone_then_the_system_is_invalid() -> None:
    from workbench.bench.offline.throughput import RunPolicy, SystemResult, judge, table, timed
    from workbench.harness.validity import FixedCpuWatch

    # warm-up unmeasured; timed calls see 50%, 40% (both redone), 20% (kept), 10%, 30% (kept:
    # no retries left). The worst kept share is 30%.
    watch = FixedCpuWatch(0.5, 0.4, 0.2, 0.1, 0.3)
    policy = RunPolicy(runs=3, max_others=0.15, retries=2, watch=watch)
    runs = timed(lambda: [[1]], policy)
    assert len(runs.run_s) == 3 and watch.calls == 5 and runs.worst == 0.3
    assert runs.others == [0.2, 0.1, 0.3] and runs.redone == 2

    def result(name: str, others_cpu: float) -> SystemResult:
        return SystemResult(name=name, run_s=[1.0], single_run_s=[1.0], output_tokens=100,
                            total_tokens=200, single_tokens=10, others_cpu=others_cpu,
                            mismatches=0, token_ids=[[1]])

    rs = [result("engine", 0.05), result("hf-generate", 0.3), result("vllm-best", float("nan"))]
    # no per-run shares (a peer that reports only its worst): its runs count as undisturbed
    assert judge(rs, 0.15) == ["INVALID system hf-generate: other processes used 30% of the "
                               "CPUs (threshold 15%); not used for any result (the table "
                               "shows the median of its 1 undisturbed run)"]
    assert [r.valid for r in rs] == [True, False, True]
    assert rs[1].invalid_reason.startswith("other processes used 30% of the CPUs")
    rows = table(rs, roofline_tok_s=1000.0).splitlines()
    assert rows[2] == "| engine | 100.0 | 200.0 | 100.00 | 1.00x | 10.0% | 0/1 | 5% | \u2014 |"
    assert rows[3] == ("| hf-generate | 100.0 | 200.0 | 100.00 | n/a (invalid) | 10.0% | 0/1 | "
                       "30% INVALID | \u2014 |")
    assert rows[4] == "| vllm-best | 100.0 | 200.0 | 100.00 | 1.00x | 10.0% | 0/1 | - | \u2014 |"


def test_cpu_paths_names_packing_and_every_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.bench.offline.throughput import cpu_paths

    monkeypatch.setenv("WORKBENCH_CPU_PACKED_GEMM", "0")
    line = cpu_paths()
    assert line.startswith("packed GEMM off (disabled by WORKBENCH_CPU_PACKED_GEMM=0); ")
    assert [part.split("=")[0] for part in line.split("; ")[1].split(", ")] == [
        "paged_decode", "rotary", "rms_norm"]


def test_small_preset_builds_its_model_and_workload(tmp_path: Path) -> None:
    from workbench.harness.offline_workload import (
        BENCH_MODELS,
        SMALL_MODEL_CONFIG,
        build_bench_checkpoint,
        make_offline_workload,
    )

    small = BENCH_MODELS["small"]
    assert (small.folder, small.num_requests, small.prompt_len_range,
            small.output_len_range) == ("llama-small", 48, (16, 128), (8, 64))
    ckpt = build_bench_checkpoint(tmp_path / "small", config=small.config)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")} == {
        "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 4096}
    marker = json.loads((ckpt / ".bench_checkpoint.json").read_text())
    assert {k: marker[k] for k in SMALL_MODEL_CONFIG} == SMALL_MODEL_CONFIG
    reqs = make_offline_workload(0, num_requests=small.num_requests,
                                 prompt_len_range=small.prompt_len_range,
                                 output_len_range=small.output_len_range)
    assert len(reqs) == 48
    assert all(16 <= len(r.prompt_token_ids) <= 128 and 8 <= r.max_tokens <= 64 for r in reqs)
