"""Every plot kind drawn from fixture data (no engine): axes that are not slivers, labels with
units, the baseline marked, SLO lines, whole ticks for integer knobs, short labels for dict
values, no empty figure saved, and no matplotlib warning on the way (warnings are errors)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from workbench.analysis import plots
from workbench.experiments.labels import value_label

# A plotting warning fails the test; a ResourceWarning is another test's socket or file being
# collected meanwhile (seen in the suite: a client socket of an earlier test in the worker).
pytestmark = [pytest.mark.filterwarnings("error"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
         "prompt_lookup_max": 5}


def sane(fig: Figure | None, tmp_path: Path, name: str = "fig.png") -> Figure:
    """Drawn, saved without a warning, every axes with data has a real span."""
    assert isinstance(fig, Figure)
    w, h = fig.get_size_inches()
    assert 2 <= w <= 30 and 1.5 <= h <= 20
    path = plots.save(fig, tmp_path / name)  # draws: layout warnings would raise here
    assert path.stat().st_size > 1000
    for ax in fig.axes:
        if not ax.has_data() or ax.get_label() == "<colorbar>":
            continue
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        assert abs(x1 - x0) > 0 and abs(y1 - y0) > 0, ax.get_title()
        bbox = ax.get_position()
        assert bbox.width > 0.05 and bbox.height > 0.05, "axes collapsed to a sliver"
    return fig


def legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def tick_texts(ax: Axes) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def whole_ticks(ax: Axes, axis: str = "x") -> bool:
    lo, hi = getattr(ax, f"get_{axis}lim")()
    ticks = [t for t in getattr(ax, f"get_{axis}ticks")() if lo <= t <= hi]
    return bool(ticks) and all(float(t).is_integer() for t in ticks)


def sweep_rows(values: list[Any], name: str, objective: str = "output_throughput"
               ) -> list[dict[str, Any]]:
    return [{name: v, objective: 100.0 + 10 * i + r, "p95_ttft_ms": 50.0 - i + 2 * r,
             "p95_tpot_ms": 8.0 + i + 0.5 * r}
            for r in range(3) for i, v in enumerate(values)]


def test_plot_labels_come_from_the_shared_value_label() -> None:
    k3 = dict(NGRAM, num_speculative_tokens=3)
    assert value_label("speculative_config", NGRAM, [None, NGRAM, k3]) == "k=5"
    assert value_label("max_num_batched_tokens", 64) == "budget=64"


def test_sweep_numeric_integer_knob_baseline_slo_and_band(tmp_path: Path) -> None:
    frame = pd.DataFrame(sweep_rows([64, 128, 256, 512, 1024], "max_num_batched_tokens",
                                    "p95_itl_ms"))
    frame["p95_ttft_ms"] = frame["p95_ttft_ms"] + 100  # near the 160 ms bound below
    fig = sane(plots.sweep_tradeoff(frame, "max_num_batched_tokens", ("p95_itl_ms",
                                                                      "p95_ttft_ms"),
                                    baseline=512, slo={"p95_ttft_ms": 160}), tmp_path)
    itl, ttft, trade = fig.axes
    assert (itl.get_xlabel(), itl.get_ylabel()) == ("max_num_batched_tokens", "p95_itl_ms (ms)")
    assert trade.get_xlabel() == "p95_itl_ms (ms)" and trade.get_ylabel() == "p95_ttft_ms (ms)"
    assert "budget=512 (baseline)" in legend_texts(itl)
    assert "range of repeats" in legend_texts(itl)  # the noise band
    assert itl.collections, "no band drawn"
    assert "SLO p95_ttft_ms \u2264 160 ms" in legend_texts(ttft)
    assert not any(t.startswith("SLO") for t in legend_texts(itl))  # ITL has no bound here
    assert tick_texts(itl) == ["64", "128", "256", "512", "1024"]  # log2, the values
    assert any("(baseline)" in t.get_text() for t in trade.texts)

    linear = pd.DataFrame(sweep_rows([1, 2, 3, 4], "max_num_seqs"))
    fig = sane(plots.sweep_tradeoff(linear, "max_num_seqs", ("output_throughput",)),
               tmp_path, "linear.png")
    assert whole_ticks(fig.axes[0])  # no 1.5 sequences


def test_sweep_baseline_from_runner_tags(tmp_path: Path) -> None:
    frame = pd.DataFrame(sweep_rows([512, 64, 2048], "params.engine.max_num_batched_tokens"))
    frame["tags.value"] = ["baseline" if v == 512 else str(v)
                           for v in frame["params.engine.max_num_batched_tokens"]]
    frame["params.engine.max_num_batched_tokens"] = frame[
        "params.engine.max_num_batched_tokens"].astype(str)  # MLflow params are text
    fig = sane(plots.sweep_tradeoff(frame, "max_num_batched_tokens",
                                    ("output_throughput", "p95_ttft_ms")), tmp_path)
    assert "budget=512 (baseline)" in legend_texts(fig.axes[0])


def test_experiment_sweep_dict_variable_categorical(tmp_path: Path) -> None:
    """make demo's case: speculative_config None (baseline) vs dicts differing in k."""
    values = [None, NGRAM, dict(NGRAM, num_speculative_tokens=3)]
    fig = sane(plots.experiment_sweep(sweep_rows(values, "speculative_config"),
                                      "speculative_config", None, "output_throughput",
                                      {"p95_tpot_ms": 9.5, "max_error_rate": 0.0}), tmp_path)
    obj, tail, trade = fig.axes
    assert tick_texts(obj) == ["spec=off\n(baseline)", "k=3", "k=5"]
    assert all(len(t) < 20 for t in tick_texts(obj))
    assert tail.get_ylabel() == "p95_tpot_ms (ms)"  # the SLO-bounded tail
    assert "SLO p95_tpot_ms \u2264 9.5 ms" in legend_texts(tail)
    assert "spec=off (baseline)" in legend_texts(obj)
    assert obj.get_ylabel() == "output_throughput (tok/s)"
    assert {t.get_text() for t in trade.texts} >= {"k=3", "k=5", "spec=off (baseline)"}


def test_far_slo_is_noted_not_squashing_the_curve(tmp_path: Path) -> None:
    rows = sweep_rows([None, NGRAM], "speculative_config")
    fig = sane(plots.experiment_sweep(rows, "speculative_config", None, "output_throughput",
                                      {"p95_tpot_ms": 1000}), tmp_path)
    tail = fig.axes[1]
    assert tail.get_ylim()[1] < 100  # the data's scale, not 0..1000
    assert "above the plotted range" in tail.get_title(loc="left")


def test_saturation_ecdf_steps_compare_and_small_helpers(tmp_path: Path) -> None:
    sat = pd.DataFrame({"concurrency": [1, 2, 4, 8] * 2,
                        "output_throughput": [10, 19, 30, 31, 11, 18, 29, 32],
                        "p95_tpot_ms": [2.0, 2.1, 2.5, 5.0, 2.2, 2.0, 2.6, 5.5]})
    fig = sane(plots.saturation_curve(sat, knee=4, slo={"p95_tpot_ms": 5.2}), tmp_path, "s.png")
    assert [ax.get_ylabel() for ax in fig.axes] == ["output_throughput (tok/s)",
                                                    "p95_tpot_ms (ms)"]
    assert "max_num_seqs = 4" in legend_texts(fig.axes[0])
    assert any(t.startswith("SLO p95_tpot_ms") for t in legend_texts(fig.axes[1]))
    assert all(whole_ticks(ax) for ax in fig.axes)

    recs = {"baseline": pd.DataFrame({"ttft_ms": [1.0, 2.0, 3.0], "success": [True] * 3}),
            "64": pd.DataFrame({"ttft_ms": [1.0, 2.0, 3.0], "success": [True] * 3})}
    fig = sane(plots.latency_ecdf(recs, "ttft_ms"), tmp_path, "e.png")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "ttft_ms (ms)"
    # identical curves stay apart: one line style per run
    assert len({line.get_linestyle() for line in ax.get_lines()}) == 2

    trace = [{"step": i, "time_s": i * 0.01, "prefill_tokens": 8 * (i < 3), "decode_tokens": 2,
              "running": 2, "waiting": 1, "kv_cache_usage_perc": 0.1 * i,
              "preemptions": int(i == 4)} for i in range(6)]
    fig = sane(plots.step_series(trace), tmp_path, "t.png")
    assert fig.axes[-1].get_xlabel() == "time_s (s)"
    assert whole_ticks(fig.axes[1], "y")  # requests are whole

    cmp = pd.DataFrame({"metric": ["p95_itl_ms", "p95_ttft_ms"] * 2, "value": [64, 64, 2048, 2048],
                        "baseline_median": [10.0, 20.0, 10.0, 20.0], "delta": [-2.0, 3, 0.1, -0.2],
                        "noise_low": [-3.0, 1, -1, -1], "noise_high": [-1.0, 5, 1, 1],
                        "verdict": ["better", "worse", "no change", "no change"],
                        "variable": "max_num_batched_tokens"})
    fig = sane(plots.compare_plot(cmp), tmp_path, "c.png")
    assert "baseline median" in legend_texts(fig.axes[0])

    grid = pd.DataFrame({"block_size": [8, 16, 8, 16], "max_model_len": [256, 256, 512, 512],
                         "max_concurrency": [4, 4, 2, 2]})
    sane(plots.grid_heatmap(grid, "block_size", "max_model_len", "max_concurrency"), tmp_path,
         "g.png")
    sane(plots.bar_compare(grid, "block_size", "max_concurrency", col="max_model_len"), tmp_path,
         "b.png")
    sane(plots.memory_split(pd.DataFrame({"weights": [1 << 20], "kv": [3 << 20]},
                                         index=["engine"])), tmp_path, "m.png")


def test_spec_plots_band_baseline_and_k0(tmp_path: Path) -> None:
    frame = pd.DataFrame({"k": [0, 2, 4], "concurrency": [1, 1, 1],
                          "speedup": [1.0, 1.4, 1.6], "speedup_low": [0.9, 1.3, 1.5],
                          "speedup_high": [1.1, 1.5, 1.7], "predicted_speedup": [1.0, 1.5, 1.8],
                          "acceptance_by_position": [[], [0.9, 0.7], [0.9, 0.7, 0.5, 0.3]]})
    fig = sane(plots.speedup_vs_k(frame), tmp_path, "sp.png")
    ax = fig.axes[0]
    texts = legend_texts(ax)
    assert "k=0, no speculation (baseline)" in texts and "C=1 range of runs" in texts
    assert whole_ticks(ax)
    fig = sane(plots.acceptance_by_position(frame[frame["k"] > 0]), tmp_path, "acc.png")
    assert whole_ticks(fig.axes[0]) and fig.axes[0].get_ylabel() == "accepted / drafts (fraction)"
    # notebook 07 at k = 0: nothing drafted -> no figure (and publish leaves it out)
    assert plots.acceptance_by_position(frame[frame["k"] > 0].iloc[0:0]) is None
    assert plots.acceptance_by_position(frame[frame["k"] == 0]) is None


def test_acceptance_plot_shows_all_four_series(tmp_path: Path) -> None:
    """Notebook 07's sweep over k at concurrencies 1 and 4: greedy acceptance does not depend
    on the batch, so both concurrencies of one k carry the same numbers. Each of the 4 series
    is drawn apart (nudged x, own marker and line style per concurrency, colour per k)."""
    same3, same5 = [0.9, 0.7, 0.5], [0.9, 0.7, 0.5, 0.4, 0.3]
    frame = pd.DataFrame({"k": [3, 3, 5, 5], "concurrency": [1, 4, 1, 4],
                          "acceptance_by_position": [same3, same3, same5, same5]})
    ax = sane(plots.acceptance_by_position(frame), tmp_path, "acc4.png").axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert sorted(lines) == ["k=3 C=1", "k=3 C=4", "k=5 C=1", "k=5 C=4"]
    assert legend_texts(ax) == ["k=3 C=1", "k=3 C=4", "k=5 C=1", "k=5 C=4"]
    points = {name: set(zip(ln.get_xdata(), ln.get_ydata(), strict=True))
              for name, ln in lines.items()}
    for a in points:
        for b in points:
            assert a == b or not points[a] & points[b], (a, b)  # no point hidden by another
    nudges = [-0.075, -0.025, 0.025, 0.075]  # per series, in (k, C) order
    for name, nudge in zip(sorted(lines), nudges, strict=True):
        xs = lines[name].get_xdata()
        assert [round(x - i, 3) for i, x in enumerate(xs)] == [nudge] * len(xs)
    for k in (3, 5):
        a, b = lines[f"k={k} C=1"], lines[f"k={k} C=4"]
        assert list(a.get_ydata()) == list(b.get_ydata())  # the data coincide ...
        assert (a.get_marker(), a.get_linestyle()) != (b.get_marker(), b.get_linestyle())
        assert a.get_color() == b.get_color()  # ... one colour per k
    assert lines["k=3 C=1"].get_color() != lines["k=5 C=1"].get_color()


def test_sweep_metrics_plot_keeps_invalid_points_off_the_line(tmp_path: Path) -> None:
    frame = pd.DataFrame({"k": pd.Series([0, 3, 5], dtype=object), "valid": [True, False, True],
                          "speedup_c1": [1.0, 1.6, 1.4], "speedup_c4": [1.0, 1.2, 1.1]})
    fig = sane(plots.sweep_metrics(frame, "k", ["speedup_c1", "speedup_c4"]), tmp_path)
    assert len([a for a in fig.axes if a.get_visible()]) == 2
    ax = fig.axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "measured"]
    assert list(line.get_xdata()) == [0, 5] and list(line.get_ydata()) == [1.0, 1.4]
    assert "INVALID (disturbed; not read)" in legend_texts(ax)
    assert plots.sweep_metrics(frame.assign(speedup_c1=None, speedup_c4=None), "k",
                               ["speedup_c1", "speedup_c4"]) is None


def test_no_data_no_figure_and_no_empty_picture(tmp_path: Path) -> None:
    empty = pd.DataFrame({"concurrency": [], "output_throughput": [], "p95_tpot_ms": []})
    assert plots.saturation_curve(empty) is None
    assert plots.sweep_tradeoff(empty, "concurrency", ("output_throughput",)) is None
    assert plots.latency_ecdf({"a": pd.DataFrame({"ttft_ms": []})}) is None
    assert plots.step_series([]) is None
    assert plots.experiment_sweep([{"x": 1, "p95_ttft_ms": 1.0}], "x", 1,
                                  "output_throughput") is None  # objective missing
    with pytest.raises(ValueError, match="no data"):
        plots.save(None, tmp_path / "none.png")
    fig, _ = plots._figure(1)
    with pytest.raises(ValueError, match="empty figure"):
        plots.save(fig, tmp_path / "blank.png")
    assert not list(tmp_path.iterdir())

    from workbench.analysis.notebook import publish

    out = publish("nb", figures={"acc": None}, figures_dir=tmp_path / "figs")
    assert out["figures"] == []


def test_runner_sweep_png_for_a_dict_variable(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """`workbench run`'s plots/sweep.png with speculative_config values differing in k:
    categories labelled k=..., the baseline (None) marked, no warning."""
    from workbench.experiments.run_record import RunRecord
    from workbench.experiments.stages.publish import _log_sweep_plot

    k3 = dict(NGRAM, num_speculative_tokens=3)
    template = SimpleNamespace(
        name="ngram-speculation", variable_name="speculative_config",
        baseline={"dtype": "float32", "speculative_config": None},
        objective=SimpleNamespace(metric="output_throughput"),
        slo={"p95_tpot_ms": 1000, "max_error_rate": 0.0})
    runs = [RunRecord(label="baseline" if row["speculative_config"] is None else "v",
                      value=row.pop("speculative_config"), repeat=n // 3, run_id=str(n),
                      metrics=row)
            for n, row in enumerate(sweep_rows([None, NGRAM, k3], "speculative_config"))]
    drawn: list[Figure] = []
    real_save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.append(fig) or real_save(fig, path))
    logged: list[tuple[str, str]] = []

    class Store:
        def log_artifact(self, run: str, path: Path, folder: str | None = None) -> None:
            logged.append((Path(path).name, folder))
            assert Path(path).stat().st_size > 1000

    _log_sweep_plot(Store(), "parent", template, runs)
    assert logged == [("sweep.png", None)]
    obj = drawn[0].axes[0]
    assert tick_texts(obj) == ["spec=off\n(baseline)", "k=3", "k=5"]
    assert "spec=off (baseline)" in legend_texts(obj)
    assert drawn[0].axes[1].get_ylabel() == "p95_tpot_ms (ms)"

    logged.clear()
    _log_sweep_plot(Store(), "parent", template,
                    [RunRecord("baseline", None, 0, "r", metrics={})])
    assert logged == []  # nothing to draw: nothing logged, no warning


def test_compare_and_bar_plots_label_dict_values_short(tmp_path: Path) -> None:
    k3 = dict(NGRAM, num_speculative_tokens=3)
    cmp = pd.DataFrame({"metric": ["output_throughput", "p95_ttft_ms"] * 2,
                        "value": [NGRAM, NGRAM, k3, k3],
                        "baseline_median": [100.0, 20.0, 100.0, 20.0],
                        "delta": [20.0, 1.0, 10.0, -1.0], "noise_low": [15.0, -1, 5, -2],
                        "noise_high": [25.0, 3, 15, 0],
                        "verdict": ["better", "no change", "better", "no change"],
                        "variable": "speculative_config"})
    fig = sane(plots.compare_plot(cmp), tmp_path, "c.png")
    ax = fig.axes[0]
    texts = legend_texts(ax)
    assert "k=5" in texts and "k=3" in texts
    assert not any("{" in t for t in texts)
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        plots._label("output_throughput"), plots._label("p95_ttft_ms")]
    assert ax.get_title() == "spec vs baseline (line: noise band)"

    frame = pd.DataFrame({"variant": [None, NGRAM, k3] * 2,
                          "enable_prefix_caching": [True, True, True, False, False, False],
                          "output_throughput": [100.0, 130.0, 120.0, 90.0, 125.0, 118.0]})
    fig = sane(plots.bar_compare(frame.rename(columns={"variant": "speculative_config"}),
                                 "speculative_config", "output_throughput",
                                 col="enable_prefix_caching"), tmp_path, "b.png")
    assert [ax.get_title() for ax in fig.axes] == ["prefix_caching=on", "prefix_caching=off"]
    assert tick_texts(fig.axes[0]) == ["off", "k=5", "k=3"]
    assert fig.axes[0].get_ylabel() == plots._label("output_throughput")
