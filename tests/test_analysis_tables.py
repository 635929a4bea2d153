"""The notebook helpers that keep cells short: tables, metric dicts, template overrides.

The loops that start engines or routers (`experiments.loops`, the studies'
layout_table / latency_pair / scaling, `analysis.replicas.policy_tables`) run in
tests/test_notebooks*.py, which execute every notebook; this file covers the pure parts."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from workbench.analysis import tables
from workbench.analysis.notebook import override_template, raw_template
from workbench.analysis.spec import sweep_curve
from workbench.experiments.studies.speculation import spec_config
from workbench.planning import memory_budget

MiB = 1 << 20


def _output(prompt: int, out: int, text: str) -> SimpleNamespace:
    completion = SimpleNamespace(token_ids=list(range(out)), finish_reason="length", text=text)
    metrics = SimpleNamespace(num_cached_tokens=0, time_to_first_token_s=0.01)
    return SimpleNamespace(prompt_token_ids=list(range(prompt)), outputs=[completion],
                           metrics=metrics)


def test_generation_frame_one_row_per_output() -> None:
    frame = tables.generation_frame([_output(5, 3, "x" * 80), _output(7, 2, "short")])
    assert list(frame["prompt_tokens"]) == [5, 7] and list(frame["output_tokens"]) == [3, 2]
    assert list(frame["text"]) == ["x" * 50, "short"]
    assert list(frame.columns) == ["prompt_tokens", "output_tokens", "finish_reason",
                                   "cached_tokens", "ttft_s", "text"]


def test_memory_tables_follow_calc() -> None:
    budget = memory_budget(64 * MiB, 10 * MiB, 4096, 16, activation_bytes=8 * MiB,
                           headroom_bytes=4 * MiB, max_model_len=1024)
    readout = {"weight_bytes": budget["weight_bytes"], "num_blocks": 7,
               "kv_token_capacity": 112, "max_concurrency": 0.1}
    check = tables.memory_check(budget, readout)
    assert list(check.index) == ["weight_bytes", "kv blocks", "kv_token_capacity",
                                 "max_concurrency"]
    assert check.loc["kv blocks", "calc.memory_budget"] == budget["kv_num_blocks"]
    assert check.loc["kv blocks", "engine.memory_readout"] == 7
    parts = tables.budget_parts(budget, "64 MiB")
    assert parts.loc["64 MiB"].sum() == 64 * MiB  # weights + KV + activations + headroom

    grid = tables.capacity_grid(64 * MiB, 10 * MiB, 4096, [8, 16], [256, 1024],
                                activation_bytes=8 * MiB, headroom_bytes=4 * MiB)
    assert list(zip(grid["block_size"], grid["max_model_len"], strict=True)) == [
        (8, 256), (8, 1024), (16, 256), (16, 1024)]
    row = grid[(grid["block_size"] == 16) & (grid["max_model_len"] == 1024)].iloc[0]
    assert row["kv_token_capacity"] == budget["kv_token_capacity"]
    assert row["max_concurrency"] == pytest.approx(budget["max_concurrency"])


def test_row_metrics_skip_missing_and_nan() -> None:
    side = pd.DataFrame({"variant": ["full", "int8"], "mean_kl": [0.0, float("nan")],
                         "tok_s_c1": [10.0, 8.0]})
    assert tables.row_metrics(side, "variant", ["mean_kl", "tok_s_c1", "absent"]) == {
        "full_mean_kl": 0.0, "full_tok_s_c1": 10.0, "int8_tok_s_c1": 8.0}
    assert tables.row_metrics(side, "variant", ["tok_s_c1"], sep=".") == {
        "full.tok_s_c1": 10.0, "int8.tok_s_c1": 8.0}


def test_group_medians_and_layout_metrics() -> None:
    runs = pd.DataFrame({"policy": ["rr", "rr", "pa"], "ttft": [1.0, 3.0, 5.0]})
    assert tables.group_medians(runs, "policy", ["ttft"]) == {"rr_ttft": 2.0, "pa_ttft": 5.0}
    assert tables.group_medians(runs, "policy", ["ttft"], {"rr": "round"}) == {
        "round_ttft": 2.0, "pa_ttft": 5.0}

    cols = {"output_throughput": [10.0, 16.0, 6.0], "p95_ttft_ms": [1.0, 2.0, 3.0],
            "p95_tpot_ms": [4.0, 5.0, 6.0], "scaling_efficiency": [1.0, 0.8, 0.3]}
    layouts = pd.DataFrame({"layout": ["1 worker", "2 replicas (TP=1)", "1 replica, TP=2"],
                            **cols})
    names = {"2 replicas (TP=1)": "replicas", "1 replica, TP=2": "tp2"}
    latency = pd.DataFrame({"layout": list(names), "median_tpot_ms": [7.0, 9.0]})
    comm = pd.DataFrame({"tokens": [1, 8], "median_us": [300.0, 400.0]})
    m = tables.layout_metrics(layouts, latency, comm, 10.0, names)
    assert m["throughput_1"] == 10.0 and m["replicas_output_throughput"] == 16.0
    assert m["tp2_scaling_efficiency"] == 0.3 and m["tp2_c1_median_tpot_ms"] == 9.0
    assert m["allreduce_median_us_1_token"] == 300.0
    assert not any(k.startswith("1 worker") for k in m)
    bare = tables.layout_metrics(layouts, pd.DataFrame(), pd.DataFrame(), 10.0, names)
    assert "tp2_c1_median_tpot_ms" not in bare and "allreduce_median_us_1_token" not in bare


def test_skipped_note_and_variant_configs() -> None:
    from workbench.experiments.studies.quantization import VARIANTS

    assert tables.skipped_note({}) == ""
    assert "- `fp8`: no" in tables.skipped_note({"fp8": "no"})
    before = copy.deepcopy(VARIANTS)
    chosen = tables.variant_configs(iter(["full", "int4"]), int4_group_size=32)
    assert list(chosen) == ["full", "int4"]
    assert chosen["int4"]["quantization_group_size"] == 32
    assert VARIANTS == before  # copies: the module's table is untouched
    with pytest.raises(ValueError, match="must be among"):
        tables.variant_configs(["int3"])


def test_override_template_copies_and_scales_down() -> None:
    raw = raw_template("", "routing_policy.yaml")  # this checkout's experiments/ file
    before = repr(raw)
    out = override_template(raw, name="nb", seed=3, repeats=1,
                            workload_params={"num_requests": 6},
                            arrivals={"mode": "closed", "concurrency": 2},
                            drop=("quality_gate",))
    assert repr(raw) == before  # the input is not changed
    assert out["name"] == "nb" and out["workload"]["seed"] == 3 and out["repeats"] == 1
    assert out["workload"]["params"]["num_requests"] == 6
    assert out["workload"]["params"].items() >= {
        k: v for k, v in raw["workload"]["params"].items() if k != "num_requests"}.items()
    assert out["arrivals"] == {"mode": "closed", "concurrency": 2}
    assert out["variable"] == raw["variable"]  # no values given: the template's
    assert override_template(raw, values=[7])["variable"]["values"] == [7]
    assert "quality_gate" not in override_template({"quality_gate": {}, "workload": {}},
                                                   drop=("quality_gate",))


def test_raw_template_reads_a_given_file(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("name: x\nworkload: {fixture: balanced-chat}\n")
    assert raw_template(str(path), "unused.yaml")["name"] == "x"
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        raw_template(str(path), "unused.yaml")


def test_spec_config_and_standalone_curve() -> None:
    assert spec_config("ngram", 3)["prompt_lookup_max"] == 5
    assert spec_config("draft_model", 2, "demo-draft") == {
        "method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="method"):
        spec_config("medusa", 2)
    frame = pd.DataFrame({"k": [2], "speedup": [1.5]})
    assert sweep_curve(frame, {"speedup_c1": 1.5}) is frame  # not a sweep point: no logging


def test_layout_names() -> None:
    from workbench.analysis.replicas import layout_names

    assert layout_names(2) == {1: "2 replicas (TP=1)", 2: "1 replica, TP=2"}
    assert layout_names(4)[4] == "1 replica, TP=4"


def test_override_template_repeats_turn_the_adaptive_rounds_off() -> None:
    raw = raw_template("", "prefix_caching.yaml")  # repeats 3, max_repeats 10
    assert raw["max_repeats"] == 10
    assert "max_repeats" not in override_template(raw, repeats=12)  # 12 > 10 stays valid
    assert override_template(raw, repeats=2, max_repeats=4)["max_repeats"] == 4
    assert override_template(raw, seed=1)["max_repeats"] == 10  # repeats untouched: kept
