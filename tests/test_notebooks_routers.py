"""Notebooks 09, 10 and 12 under papermill with small parameters: each starts routers of
bundled replicas (their fixed router ports stay in this one file, so parallel test workers
never share them). Helpers and the pair checks: tests/test_notebooks.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.test_notebooks import NOTEBOOKS, _parameters_cell, execute, pngs, text_of


@pytest.mark.slow  # WORKBENCH_SLOW_TESTS=1 (tests/conftest.py)
def test_09_tp_vs_replicas(tmp_path: Path) -> None:
    """2 workers as 2 replicas and as one TP=2 replica (the router's /metrics sees 2 and 1
    replicas), one-worker reference, the all-reduce timing; the concurrency-1 pair is skipped
    to save two router starts."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("09_tp_vs_replicas.ipynb", tmp_path, model="bundled", num_requests=6,
                       concurrency=2, latency_requests=0, allreduce_iters=10, port=8193,
                       mlflow_uri=uri, mlflow_experiment="tp-nb")
    text = text_of(nb)
    assert "| value | output_throughput" in text and "floor_ms_per_step" in text
    assert pngs(figs) == {"throughput.png", "tpot_ecdf.png"}
    from workbench.analysis import parent_runs, run_artifact_frame

    run = parent_runs("tp-nb", uri).loc[0]
    layouts = run_artifact_frame(run["run_id"], "09_tp_vs_replicas/layouts.csv", uri)
    assert list(layouts["layout"]) == ["1 worker", "2 replicas (TP=1)", "1 replica, TP=2"]
    assert list(layouts["completed"]) == [6, 6, 6]
    assert list(layouts["replicas_seen"].fillna(-1)) == [-1, 2, 1]
    assert layouts.loc[0, "scaling_efficiency"] == 1.0
    tput = layouts.set_index("layout")["output_throughput"]
    assert run["metrics.replicas_scaling_efficiency"] == pytest.approx(
        tput["2 replicas (TP=1)"] / (2 * tput["1 worker"]))
    assert run["metrics.tp2_scaling_efficiency"] == pytest.approx(
        tput["1 replica, TP=2"] / (2 * tput["1 worker"]))
    assert run["metrics.allreduce_median_us_1_token"] > 0
    assert run["metrics.allreduce_valid"] == 1.0  # the suite states a quiet machine


@pytest.mark.slow  # WORKBENCH_SLOW_TESTS=1 (tests/conftest.py)
def test_10_routing_round_robin_vs_prefix_aware(tmp_path: Path) -> None:
    """One router of 2 bundled replicas per policy (the 1-vs-2 scaling runs are skipped to
    save two more router starts): round-robin splits every prefix group (no hit),
    prefix-aware reuses each group's prefix."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("10_routing.ipynb", tmp_path, model="bundled", num_requests=6,
                       num_prefix_groups=3, prefix_len=128, rate=20.0, port=8191,
                       scaling_requests=0, mlflow_uri=uri, mlflow_experiment="routing-nb")
    text = text_of(nb)
    assert "| value | p95_ttft_ms" in text and "prefix_hit_rate" in text
    assert pngs(figs) == {"ttft_ecdf.png", "hit_rate.png"}
    from workbench.analysis import parent_runs

    run = parent_runs("routing-nb", uri).loc[0]
    assert run["metrics.round_robin_prefix_hit_rate"] == 0.0
    # 3 of 6 prompts reuse 128 tokens (2 if the load bound sent one elsewhere): >= 0.25
    assert run["metrics.prefix_aware_prefix_hit_rate"] > 0.2


@pytest.mark.slow  # WORKBENCH_SLOW_TESTS=1 (tests/conftest.py)
def test_12_pd_disaggregation_quick(tmp_path: Path) -> None:
    """`quick`: one shape at one rate, one repeat: a colocated and a 1P:1D router of the
    bundled model (2 router starts); the decode replica reads every prompt's KV, the
    colocated pair none; calc's rates sit beside the measured goodput."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("12_pd_disaggregation.ipynb", tmp_path, model="bundled", quick=True,
                       shapes=["mixed"], rates_mixed=[2.0, 4.0, 8.0], num_requests_mixed=4,
                       capacity_batch=2, port=8194, mlflow_uri=uri, mlflow_experiment="pd-nb")
    text = text_of(nb)
    assert "measured_over_calc" in text and "balanced_p_over_m" in text
    assert pngs(figs) == {"attainment_mixed.png", "latency_cdf_mixed.png",
                          "pd_ratio_mixed.png"}
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "memcpy over loopback" in source and "2 cores" in source
    from workbench.analysis import parent_runs, run_artifact_frame

    run = parent_runs("pd-nb", uri).loc[0]
    assert run["params.num_requests_mixed"] == 4  # only the swept shape's count
    assert "params.num_requests_decode_heavy" not in run
    kv = run_artifact_frame(run["run_id"], "12_pd_disaggregation/kv.csv", uri).set_index(
        "layout")
    assert kv.loc["colocated x2", "kv_reads"] == 0 and kv.loc["1P:1D", "kv_reads"] == 4
    assert kv.loc["1P:1D", "failed_reads"] == 0 and kv.loc["1P:1D", "mb_read"] > 0
    goodput = run_artifact_frame(run["run_id"], "12_pd_disaggregation/goodput.csv", uri)
    assert list(goodput["layout"]) == ["colocated x2", "1P:1D"]
    assert list(goodput["repeats"]) == [1, 1]
    points = run_artifact_frame(run["run_id"], "12_pd_disaggregation/points.csv", uri)
    assert list(points["rate"]) == [4.0, 4.0] and (points["status"] == "FINISHED").all()
    assert (points["completed"] == 4).all()  # num_requests_mixed requests per point


def test_12_defaults_queue_decode_heavy_past_one_batch() -> None:
    """Notebook 12's defaults: 32 requests per point on prefill-heavy and mixed traffic, 96
    (three times the template's max_num_seqs) on decode-heavy, whose rates are the ones the
    docs' figures come from; the templates the notebook runs carry those counts."""
    from workbench.analysis.notebook import raw_template
    from workbench.experiments.studies import pd_disaggregation as st

    nb = nbformat.read(NOTEBOOKS / "12_pd_disaggregation.ipynb", as_version=4)
    defaults: dict[str, Any] = {}
    exec(nb.cells[_parameters_cell(nb)].source, defaults)  # noqa: S102 - its parameters cell
    counts = {"prefill-heavy": defaults["num_requests_prefill_heavy"],
              "decode-heavy": defaults["num_requests_decode_heavy"],
              "mixed": defaults["num_requests_mixed"]}
    assert counts == {"prefill-heavy": 32, "decode-heavy": 96, "mixed": 32}
    assert defaults["rates_decode_heavy"] == [6.0, 12.0, 18.0]
    raw = raw_template("", "pd_disaggregation.yaml")
    assert counts["decode-heavy"] == 3 * raw["baseline"]["max_num_seqs"]
    shaped = {shape: st.shape_template(raw, shape, num_requests=counts) for shape in st.SHAPES}
    assert {s: t["workload"]["params"]["num_requests"] for s, t in shaped.items()} == counts

