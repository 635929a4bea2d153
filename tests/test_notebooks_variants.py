"""Notebooks 07, 08 and 11 under papermill with small parameters: a sweep over k, the
quantization variants, the KV offload tiers, each measured through the experiment runner
(`workbench.experiments.studies`). Helpers and the pair checks: tests/test_notebooks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_notebooks import NOTEBOOKS, execute, num_images, pngs, text_of


@pytest.mark.slow  # WORKBENCH_SLOW_TESTS=1 (tests/conftest.py)
def test_07_speculative_sweep_over_k_draws_the_curve_from_every_point(tmp_path: Path) -> None:
    """`workbench sweep -p num_speculative_tokens 0 2` on the bundled model with itself as the
    draft (every draft accepted): the last point reads both points back from MLflow."""
    from workbench.analysis import runs_frame
    from workbench.analysis.spec import sweep_spec_frame
    from workbench.sweeps.driver import sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rows = sweep(NOTEBOOKS / "07_speculative_decoding.ipynb", "num_speculative_tokens", [0, 2],
                 fixed={"model": "bundled", "method": "draft_model", "draft_model": "bundled",
                        "concurrencies": [1], "num_requests": 2, "runs": 1,
                        "figures_dir": str(tmp_path / "figs")},
                 experiment="spec-sweep", uri=uri, out_dir=tmp_path, progress=False)
    assert [r["status"] for r in rows] == ["FINISHED", "FINISHED"]
    points = runs_frame("spec-sweep", uri)
    last = points.sort_values("start_time").iloc[-1]["run_id"]
    curve = sweep_spec_frame(uri, last)
    assert list(curve["k"]) == [0, 2] and list(curve["concurrency"]) == [1, 1]
    assert curve.loc[0, "speedup"] == 1.0 and curve.loc[1, "acceptance_rate"] == 1.0
    first, second = curve.loc[1, "acceptance_by_position"]
    # every draft accepted; position 1 only lacks the drafts cut to one token by max_tokens
    assert first == 1.0 and 0.9 < second <= 1.0
    assert curve.loc[1, "predicted_speedup"] > 1.5
    assert pngs(tmp_path / "figs") == {"speedup_vs_k.png", "acceptance_by_position.png"}


@pytest.mark.slow  # WORKBENCH_SLOW_TESTS=1 (tests/conftest.py)
def test_08_quantization_side_by_side(tmp_path: Path) -> None:
    """Every variant (FP8 KV included) runs on the demo model; memory, quality and speed land
    side by side and the CPU caveat is stated."""
    nb, figs = execute("08_quantization.ipynb", tmp_path, concurrencies=[1, 4], rounds=1,
                       input_len=16, output_len=8, quality_prompts=2, quality_max_tokens=8,
                       ppl_tokens=256)
    text = text_of(nb)
    for variant in ("full", "int8", "int4", "fp8", "fp8-kv"):
        assert variant in text
    assert "Skipped" not in text  # the engine accepted every variant
    assert "kv_token_capacity" in text and "ppl_increase_pct" in text and "us at 1 tokens" in text
    assert "other_cpu_share" in text  # the layer timing is watched as a run is
    assert "tok_s_c4" in text and "speed_vs_full_c1" in text
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Read the speed numbers as a CPU's, not a GPU's" in source
    assert pngs(figs) == {"memory.png", "throughput.png", "tpot.png"}


def test_11_kv_offload_host_tier_vs_off(tmp_path: Path) -> None:
    """4 users x 3 turns on a 41-block pool (the histories need about 64 blocks), 2 running
    at once: off never reads a tier; the host tier brings evicted histories back, and every
    byte it loads is a hit token's KV; a first turn can only reuse the shared system prompt."""
    import json

    from workbench.analysis import parent_runs, run_artifact_frame
    from workbench.config.named_models import resolve_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("11_kv_offload.ipynb", tmp_path, model="demo", num_users=4, num_turns=3,
                       think_time_s=0.05, num_gpu_blocks=41, max_num_seqs=2, repeats=1,
                       mlflow_uri=uri, mlflow_experiment="kv-nb")
    assert "external_prefix_cache_hit_rate" in text_of(nb)
    assert pngs(figs) == {"ttft_by_turn.png", "reuse_by_turn.png"} and num_images(nb) == 2
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "](../docs/kv_offload.md)" in source and "memcpy" in source and "PCIe" in source

    run = parent_runs("kv-nb", uri).loc[0]
    tiers = run_artifact_frame(run["run_id"], "11_kv_offload/tiers.csv", uri)
    assert list(tiers["config"]) == ["off", "host tier"] and list(tiers["repeats"]) == [1, 1]
    off, on = tiers.iloc[0], tiers.iloc[1]
    for col in ("external_prefix_cache_hit_rate", "kv_host_hit_tokens", "kv_load_mb",
                "kv_store_mb", "kv_transfer_time_share"):
        assert off[col] == 0.0, col
    assert off["prefix_cache_hit_rate"] > 0  # the system prompt and the histories kept
    assert on["external_prefix_cache_hit_rate"] > 0 and on["kv_host_hit_tokens"] > 0
    assert on["kv_store_mb"] > 0 and 0 < on["kv_transfer_time_share"] < 1
    cfg = json.loads((Path(resolve_model("demo")) / "config.json").read_text())
    kv_bytes_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] \
        * cfg["head_dim"] * 4  # K and V, float32
    assert round(on["kv_load_mb"] * 1e6) == on["kv_host_hit_tokens"] * kv_bytes_per_token
    assert run["metrics.host_tier.external_prefix_cache_hit_rate"] == \
        on["external_prefix_cache_hit_rate"]

    requests = run_artifact_frame(run["run_id"], "11_kv_offload/requests.csv", uri)
    assert requests.groupby("config")["success"].agg(["size", "all"]).to_dict("index") == {
        "host tier": {"size": 12, "all": True}, "off": {"size": 12, "all": True}}
    assert not requests.loc[requests["config"] == "off", "kv_loaded"].any()
    first = requests[requests["turn"] == 0]
    assert (first["cached_tokens"] <= 32).all() and not first["kv_loaded"].any()
    later = requests[(requests["config"] == "host tier") & (requests["turn"] > 0)]
    assert later["kv_loaded"].any()  # a history evicted from the pool came back from the tier
    assert (later.loc[later["kv_loaded"], "cached_tokens"] >= 16).all()  # a whole block at least
    turns = run_artifact_frame(run["run_id"], "11_kv_offload/turns.csv", uri)
    assert list(zip(turns["config"], turns["turn"], strict=True)) == [
        ("off", 0), ("off", 1), ("off", 2), ("host tier", 0), ("host tier", 1),
        ("host tier", 2)]
