"""workbench.analysis.disagg's figures from fixture data (no engine): the plotted x/y data,
labels and reference lines exactly, and one clear ValueError for bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from workbench import planning as calc
from workbench.analysis import disagg, plots

# A plotting warning fails the test; a ResourceWarning is another test's socket or file being
# collected meanwhile (seen in the suite: a client socket of an earlier test in the worker).
pytestmark = [pytest.mark.filterwarnings("error"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


def legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def line(ax: Axes, label: str) -> tuple[list[float], list[float]]:
    found = [ln for ln in ax.get_lines() if ln.get_label() == label]
    assert len(found) == 1, [ln.get_label() for ln in ax.get_lines()]
    x, y = found[0].get_data()
    return [float(v) for v in np.asarray(x)], [float(v) for v in np.asarray(y)]


def saved(fig: Figure, tmp_path: Path) -> Figure:
    assert plots.save(fig, tmp_path / "fig.png").stat().st_size > 1000  # draws: no warning
    return fig


CURVES = {
    "colocated 2": [(2.0, 0.7, 0.6, 0.8), (1.0, 0.95, 0.9, 1.0), (3.0, 0.2, 0.1, 0.3)],
    "1P:1D": [(1.0, 1.0, 1.0, 1.0), (2.0, 0.92, 0.9, 0.95), (3.0, 0.5, 0.4, 0.6)],
}


def test_slo_attainment_lines_bands_target_and_goodput(tmp_path: Path) -> None:
    fig = saved(disagg.slo_attainment_plot(CURVES, 0.9, goodputs={"1P:1D": 2.1}), tmp_path)
    (ax,) = fig.axes
    assert line(ax, "colocated 2") == ([1.0, 2.0, 3.0], [0.95, 0.7, 0.2])  # sorted by rate
    assert line(ax, "1P:1D") == ([1.0, 2.0, 3.0], [1.0, 0.92, 0.5])
    assert line(ax, "target 90%") == ([0.0, 1.0], [0.9, 0.9])
    target = next(ln for ln in ax.get_lines() if ln.get_label() == "target 90%")
    assert target.get_linestyle() == "--"
    assert line(ax, "1P:1D goodput 2.1 req/s") == ([2.1, 2.1], [0.0, 1.0])
    # bands: one per curve, spanning lo..hi at each rate
    bands = ax.collections
    assert len(bands) == 2
    lo_hi = bands[0].get_paths()[0].vertices
    assert {(float(x), float(y)) for x, y in lo_hi} >= {(1.0, 0.9), (1.0, 1.0), (3.0, 0.1),
                                                        (3.0, 0.3)}
    assert legend_texts(ax) == ["colocated 2", "1P:1D", "1P:1D goodput 2.1 req/s",
                                "target 90%"]
    assert ax.get_xlabel() == "request rate (req/s)"
    assert ax.get_ylabel() == "SLO attainment (fraction of requests)"
    assert ax.get_ylim() == (0.0, 1.02)


@pytest.mark.parametrize(("args", "kw", "needle"), [
    (({}, 0.9), {}, "curves is empty"),
    ((CURVES, 1.5), {}, "target must be an attainment fraction in (0, 1], got 1.5"),
    ((CURVES, 0.9), {"goodputs": {"2P:2D": 3.0}}, "goodputs ['2P:2D'] name no curve"),
    (({"a": [(1.0, 0.5, 0.6, 0.7)]}, 0.9), {}, "need 0 <= lo <= median <= hi <= 1"),
    (({"a": [(1.0, 90.0, 80.0, 95.0)]}, 0.9), {}, "attainment as a fraction"),
    (({"a": [(1.0, 0.5)]}, 0.9), {}, "must be (rate, median, lo, hi)"),
    (({"a": []}, 0.9), {}, "curves['a'] is empty"),
])
def test_slo_attainment_bad_input(args: tuple[object, ...], kw: dict[str, object],
                                  needle: str) -> None:
    with pytest.raises(ValueError) as exc:
        disagg.slo_attainment_plot(*args, **kw)  # type: ignore[arg-type]
    assert needle in str(exc.value)


def records(ttft: list[float], tpot: list[float], success: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({"ttft_ms": ttft, "tpot_ms": tpot, "success": success})


def test_latency_cdf_one_panel_per_metric(tmp_path: Path) -> None:
    frames = {
        "colocated": records([30.0, 10.0, 20.0, 99.0], [5.0, 7.0, float("nan"), 1.0],
                             [True, True, True, False]),
        "1P:1D": {"ttft_ms": [40.0, 15.0], "tpot_ms": [3.0, 2.0]},
    }
    fig = saved(disagg.latency_cdf_plot(frames), tmp_path)
    ttft, tpot = fig.axes
    # the failed request (99 ms) is left out; the step starts at 0 at the smallest value
    assert line(ttft, "colocated (n=3)") == ([10.0, 10.0, 20.0, 30.0],
                                             [0.0, 1 / 3, 2 / 3, 1.0])
    assert line(ttft, "1P:1D (n=2)") == ([15.0, 15.0, 40.0], [0.0, 0.5, 1.0])
    # a NaN TPOT (one output token) is left out
    assert line(tpot, "colocated (n=2)") == ([5.0, 5.0, 7.0], [0.0, 0.5, 1.0])
    assert line(tpot, "1P:1D (n=2)") == ([2.0, 2.0, 3.0], [0.0, 0.5, 1.0])
    assert (ttft.get_title(), tpot.get_title()) == ("ttft_ms CDF", "tpot_ms CDF")
    assert ttft.get_xlabel().startswith("ttft_ms") and "ms" in ttft.get_xlabel()[7:]
    assert tpot.get_ylabel() == "fraction of requests"
    assert legend_texts(ttft) == ["colocated (n=3)", "1P:1D (n=2)"]


def test_latency_cdf_plain_lists_for_one_metric(tmp_path: Path) -> None:
    fig = saved(disagg.latency_cdf_plot({"a": [3.0, 1.0, 2.0, 4.0]}, "tpot_ms"), tmp_path)
    (ax,) = fig.axes
    assert line(ax, "a (n=4)") == ([1.0, 1.0, 2.0, 3.0, 4.0], [0.0, 0.25, 0.5, 0.75, 1.0])
    with pytest.raises(ValueError, match="is a plain list of values: give one metric"):
        disagg.latency_cdf_plot({"a": [1.0]})
    with pytest.raises(ValueError, match=r"frames\['a'\] has no 'tpot_ms' column"):
        disagg.latency_cdf_plot({"a": pd.DataFrame({"ttft_ms": [1.0]})})
    with pytest.raises(ValueError, match="no ttft_ms values in any of"):
        disagg.latency_cdf_plot({"a": []}, "ttft_ms")


def test_pd_ratio_plot_rates_per_split_and_measured(tmp_path: Path) -> None:
    r = calc.pd_ratio(4, 1024, 257, 8192, 1024, request_rate=3)
    fig = saved(disagg.pd_ratio_plot(r, measured={"1:3": 6.5, (2, 2): 7.0,
                                                  "colocated": 5.0}), tmp_path)
    (ax,) = fig.axes
    assert line(ax, "prefill pool") == ([0.0, 1.0, 2.0], [8.0, 16.0, 24.0])
    assert line(ax, "decode pool") == ([0.0, 1.0, 2.0], [12.0, 8.0, 4.0])
    assert line(ax, "system (min)") == ([0.0, 1.0, 2.0], [8.0, 8.0, 4.0])
    assert line(ax, "best 1:3") == ([0.0], [8.0])
    assert line(ax, "colocated x4")[1] == [pytest.approx(32 / 3)] * 2
    assert line(ax, "request rate 3")[1] == [3.0, 3.0]
    assert line(ax, "measured goodput") == ([0.0, 1.0], [6.5, 7.0])
    assert line(ax, "measured colocated")[1] == [5.0, 5.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1:3", "2:2", "3:1"]
    assert "KV link" not in legend_texts(ax)
    assert ax.get_ylabel() == "sustainable rate (req/s)"
    with pytest.raises(ValueError, match=r"measured splits \['4:0'\] are not among"):
        disagg.pd_ratio_plot(r, measured={"4:0": 1.0})


def test_pd_ratio_plot_draws_the_link_when_given(tmp_path: Path) -> None:
    r = calc.pd_ratio(3, 8192, 101, 819_200, 2000, kv_bytes_per_token=327_680,
                      link_bandwidth_bytes_per_s=50e9)
    (ax,) = saved(disagg.pd_ratio_plot(r), tmp_path).axes
    xs, ys = line(ax, "KV link")
    assert xs == [0.0, 1.0] and ys == [pytest.approx(18.6264515), pytest.approx(37.252903)]
    assert "measured goodput" not in legend_texts(ax)
