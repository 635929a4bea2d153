"""workbench.analysis: frames read back from a small MLflow store, and the standard plots."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from workbench.analysis import frames, plots
from workbench.analysis.notebook import ensure_experiment, publish
from workbench.tracking.mlflow_store import Store

EXP = "analysis-test"
# p95_itl_ms per (value, repeat): baseline spread 10..12 -> noise band +-2 around the delta
ITL = {"baseline": [10.0, 12.0, 11.0], "64": [5.0, 6.0, 7.0], "2048": [11.5, 10.5, 11.0]}
TTFT = {"baseline": [100.0, 110.0, 105.0], "64": [300.0, 310.0, 320.0],
        "2048": [90.0, 95.0, 100.0]}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """An experiment parent with 3 repeats of baseline (512) and two variants, like
    run_experiment writes it; plus one FAILED child that must be ignored."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('analysis') / 'mlflow.db'}"
    ensure_experiment(EXP, uri)  # artifacts beside the db, not in ./mlruns
    s = Store(EXP, uri)
    parent = s.create_run("exp", tags={"variable": "max_num_batched_tokens",
                                       "kind": "experiment"})
    s.log_params(parent, {"template": {"noise": "spread", "repeats": 3}})
    for repeat in range(3):
        for label, budget in (("baseline", 512), ("64", 64), ("2048", 2048)):
            rid = s.create_run(f"r{repeat}", parent_id=parent, tags={
                "variable": "max_num_batched_tokens", "value": label, "repeat": str(repeat)})
            s.log_params(rid, {"engine": {"max_num_batched_tokens": budget, "dtype": "float32"},
                               "repeat": repeat})
            s.log_metrics(rid, {"p95_itl_ms": ITL[label][repeat],
                                "p95_ttft_ms": TTFT[label][repeat],
                                "output_throughput": 100.0 + repeat})
            reqs = pd.DataFrame({"request_id": ["a", "b", "c"], "success": [True, True, False],
                                 "ttft_ms": [1.0 + repeat, 2.0, 99.0],
                                 "chunk_times_s": ["[0.0, 0.01, 0.03]", "[0.0, 0.02]", "[]"]})
            s.log_files(rid, {"requests.csv": reqs.to_csv(index=False)})
            s.finish(rid)
    bad = s.create_run("broken", parent_id=parent, tags={"value": "64", "repeat": "9"})
    s.log_metrics(bad, {"p95_itl_ms": 1e6})
    s.finish(bad, failed=True)
    s.finish(parent)
    return uri, parent


def test_runs_frame_flattens_children(store: tuple[str, str]) -> None:
    uri, parent = store
    df = frames.runs_frame(EXP, uri)
    assert len(df) == 10 and set(df["parent_run_id"]) == {parent}
    assert {"params.engine.max_num_batched_tokens", "metrics.p95_itl_ms", "tags.value",
            "run_id", "status", "start_time", "duration_s"} <= set(df.columns)
    assert pd.api.types.is_numeric_dtype(df["params.engine.max_num_batched_tokens"])
    assert set(df["params.engine.dtype"].dropna()) == {"float32"}
    assert not any(c.startswith("tags.mlflow.") for c in df.columns)
    assert (df["status"] == "FAILED").sum() == 1
    assert len(frames.runs_frame(EXP, uri, parent_run_id="nope")) == 0
    with pytest.raises(ValueError, match="not in this tracking store"):
        frames.runs_frame("no-such-experiment", uri)


def test_parent_runs(store: tuple[str, str]) -> None:
    uri, parent = store
    df = frames.parent_runs(EXP, uri)
    assert list(df["run_id"]) == [parent]
    assert df.loc[0, "tags.variable"] == "max_num_batched_tokens"
    assert df.loc[0, "params.template.noise"] == "spread"


def test_compare_frame_medians_deltas_noise(store: tuple[str, str]) -> None:
    uri, parent = store
    cf = frames.compare_frame(parent, ["p95_itl_ms", "p95_ttft_ms"], uri)
    assert list(cf.columns) == frames.COMPARE_COLUMNS
    assert list(cf["value"]) == [64, 64, 2048, 2048]  # numeric order, FAILED child ignored
    row = cf[(cf["value"] == 64) & (cf["metric"] == "p95_itl_ms")].iloc[0]
    assert row["baseline_median"] == 11.0 and row["variant_median"] == 6.0
    assert row["delta"] == -5.0 and row["relative_effect"] == pytest.approx(-5 / 11)
    assert (row["noise_low"], row["noise_high"]) == (-7.0, -3.0)  # delta -+ baseline spread 2
    assert row["verdict"] == "better" and row["n_variant"] == 3 and row["n_baseline"] == 3
    assert row["variable"] == "max_num_batched_tokens"
    ttft = cf[(cf["value"] == 64) & (cf["metric"] == "p95_ttft_ms")].iloc[0]
    assert ttft["verdict"] == "worse"
    assert cf[(cf["value"] == 2048) & (cf["metric"] == "p95_itl_ms")].iloc[0]["verdict"] == (
        "no change")
    with pytest.raises(ValueError, match="value='none'"):
        frames.compare_frame(parent, ["p95_itl_ms"], uri, baseline="none")


def test_request_frames_from_artifacts(store: tuple[str, str]) -> None:
    uri, parent = store
    got = frames.request_frames(parent, uri, repeat=1)
    assert list(got) == ["baseline", "64", "2048"]
    assert got["64"]["ttft_ms"].tolist() == [2.0, 2.0, 99.0]


def test_plots_return_figures_with_labels(store: tuple[str, str], tmp_path: Path) -> None:
    uri, parent = store
    runs = frames.runs_frame(EXP, uri)
    runs = runs[runs["status"] == "FINISHED"]

    fig = plots.sweep_tradeoff(runs, x="max_num_batched_tokens")
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    labels = [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]
    assert labels == [("max_num_batched_tokens", "p95_ttft_ms (ms)"),
                      ("max_num_batched_tokens", "p95_itl_ms (ms)"),
                      ("p95_ttft_ms (ms)", "p95_itl_ms (ms)")]  # units: the metric registry

    sat = pd.DataFrame({"concurrency": [1, 2, 4, 8], "output_throughput": [10, 19, 30, 31],
                        "p95_tpot_ms": [2.0, 2.1, 2.5, 5.0]})
    fig = plots.saturation_curve(sat, knee=4)
    assert [ax.get_xlabel() for ax in fig.axes] == ["concurrency", "concurrency"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["output_throughput (tok/s)",
                                                    "p95_tpot_ms (ms)"]
    assert any("max_num_seqs = 4" in t.get_text() for t in fig.axes[0].get_legend().get_texts())

    reqs = frames.request_frames(parent, uri)
    fig = plots.latency_ecdf(reqs, "ttft_ms")
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("ttft_ms (ms)",
                                                                    "fraction of requests")
    fig = plots.latency_ecdf(reqs, "itl_ms")  # gaps from chunk_times_s
    assert fig.axes[0].get_ylabel() == "fraction of ITL gaps"

    trace = [{"step": i, "time_s": i * 0.01, "prefill_tokens": 8 * (i < 3), "decode_tokens": 2,
              "running": 2, "waiting": 1, "kv_cache_usage_perc": 0.1 * i,
              "preemptions": int(i == 4)} for i in range(6)]
    fig = plots.step_series(trace)
    assert [ax.get_ylabel() for ax in fig.axes] == ["tokens per step", "requests",
                                                     "KV cache usage"]
    assert fig.axes[-1].get_xlabel() == "time_s (s)"

    fig = plots.compare_plot(frames.compare_frame(parent, ["p95_itl_ms", "p95_ttft_ms"], uri))
    assert fig.axes[0].get_xlabel() == "change vs baseline median (%)"

    grid = pd.DataFrame({"block_size": [8, 16, 8, 16], "max_model_len": [256, 256, 512, 512],
                         "max_concurrency": [4, 4, 2, 2]})
    fig = plots.grid_heatmap(grid, "block_size", "max_model_len", "max_concurrency")
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("block_size",
                                                                    "max_model_len")
    fig = plots.bar_compare(grid, "block_size", "max_concurrency", col="max_model_len")
    assert [ax.get_ylabel() for ax in fig.axes] == ["max_concurrency", "max_concurrency"]
    fig = plots.memory_split(pd.DataFrame({"weights": [1 << 20], "kv": [3 << 20]},
                                          index=["engine"]))
    assert fig.axes[0].get_xlabel() == "memory (MiB)"

    path = plots.save(fig, tmp_path / "sub" / "memory.png")
    assert path.is_file() and path.stat().st_size > 0
    with pytest.raises(ValueError, match="not in the frame"):
        plots.sweep_tradeoff(runs, x="no_such_knob")


def test_publish_saves_and_logs(tmp_path: Path) -> None:
    fig = plots.saturation_curve(pd.DataFrame({"concurrency": [1, 2], "output_throughput": [1, 2],
                                               "p95_tpot_ms": [1.0, 1.0]}))
    assert publish("nb", figures={"sat": fig}, figures_dir="")["run_id"] is None
    uri = f"sqlite:///{tmp_path / 'pub.db'}"
    out = publish("nb", metrics={"x": 1.0}, figures={"sat": fig}, params={"a": 1},
                  tables={"t": pd.DataFrame({"a": [1]})}, figures_dir=tmp_path / "figs",
                  mlflow_uri=uri, mlflow_experiment="pub")
    assert [p.name for p in out["figures"]] == ["sat.png"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(out["run_id"])
    assert run.data.metrics == {"x": 1.0} and run.data.params == {"a": "1"}
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(out["run_id"], "nb")} == {"nb/sat.png",
                                                                           "nb/t.csv"}


def test_spec_frame_gives_no_speedup_for_a_disturbed_point() -> None:
    import math

    from workbench.analysis.spec import spec_frame
    from workbench.harness.spec_points import SpecPoint

    off = [SpecPoint("off", 1, [2.0], 100), SpecPoint("off", 4, [1.0], 100, valid=False)]
    on = [SpecPoint("ngram k=3", 1, [1.0], 100), SpecPoint("ngram k=3", 4, [0.5], 100)]
    frame = spec_frame(off + on, 3)
    assert frame["valid"].tolist() == [True, False]
    assert frame["speedup"].iloc[0] == 2.0
    assert math.isnan(frame["speedup"].iloc[1])  # its "off" point was disturbed
