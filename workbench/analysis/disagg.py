"""Plots for prefill/decode disaggregation (DistServe / Splitwise style): each returns a
matplotlib Figure on the Agg canvas, as `workbench.analysis.plots` does.

    slo_attainment_plot  {label: [(rate, median, lo, hi), ...]} -> SLO attainment vs request
                         rate per layout, the lo-hi band of the repeats, the target as a
                         dashed line, each layout's goodput as a dotted vertical line
    latency_cdf_plot     {label: records frame | {metric: values} | values} -> the empirical
                         CDF of TTFT and TPOT, one panel per metric
    pd_ratio_plot        calc.pd_ratio's answer -> sustainable rate per split P:M (each pool
                         and the system), the colocated rate, the best split; the measured
                         goodput per layout on top
    layout_bands(points) `analysis.disagg_runs.point_runs` -> slo_attainment_plot's input:
                         {layout: [(rate, median, min, max) of attainment over repeats]}

Attainment is a fraction in [0, 1] (the share of requests meeting every SLO); rates are
requests/s. Bad input raises ValueError naming the argument and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

import pandas as pd
from matplotlib.figure import Figure

from workbench.analysis.plots import _figure, _label, _legend
from workbench.planning import PDRatio

Point = tuple[float, float, float, float]  # (request rate, median, lo, hi)
LatencyData: TypeAlias = pd.DataFrame | Mapping[str, Sequence[float]] | Sequence[float]


def _check_points(label: str, points: Sequence[Point]) -> list[Point]:
    if not points:
        raise ValueError(f"curves[{label!r}] is empty: give (rate, median, lo, hi) points")
    out = []
    for point in points:
        if len(point) != 4:
            raise ValueError(f"curves[{label!r}] point {point!r} must be (rate, median, lo, hi)")
        rate, med, lo, hi = (float(v) for v in point)
        if not (0 <= lo <= med <= hi <= 1):
            raise ValueError(f"curves[{label!r}] point at rate {rate:g}: need 0 <= lo <= "
                             f"median <= hi <= 1 (attainment as a fraction), got "
                             f"({med:g}, {lo:g}, {hi:g})")
        if rate < 0:
            raise ValueError(f"curves[{label!r}]: request rate must be >= 0, got {rate:g}")
        out.append((rate, med, lo, hi))
    return sorted(out)


def layout_bands(points: pd.DataFrame) -> dict[str, list[tuple[float, float, float, float]]]:
    """{layout: [(rate, median, min, max) of SLO attainment over repeats]} from point_runs
    (a failed point counts 0, as the sweep counted it): `slo_attainment_plot`'s input."""
    from workbench.harness.goodput import attainment_bands

    curves: dict[str, list[list[tuple[float, float]]]] = {}
    for (layout, _), g in points.groupby(["layout", "repeat"], sort=False):
        g = g.sort_values("rate")
        curves.setdefault(str(layout), []).append(
            [(float(r), 0.0 if a != a else float(a))
             for r, a in zip(g["rate"], g["slo_attainment"], strict=True)])
    return attainment_bands(curves)


def slo_attainment_plot(curves: Mapping[str, Sequence[Point]], target: float, *,
                        goodputs: Mapping[str, float] | None = None,
                        title: str | None = None) -> Figure:
    """SLO attainment against request rate, one line per label (points sorted by rate) with
    its lo-hi band, the `target` attainment as a dashed grey line and, with `goodputs`, each
    label's goodput (the highest rate meeting the target) as a dotted line of its colour."""
    if not curves:
        raise ValueError("curves is empty: give {label: [(rate, median, lo, hi), ...]}")
    if not 0 < target <= 1:
        raise ValueError(f"target must be an attainment fraction in (0, 1], got {target!r}")
    goodputs = dict(goodputs or {})
    unknown = sorted(set(goodputs) - set(curves))
    if unknown:
        raise ValueError(f"goodputs {unknown} name no curve; curves: {list(curves)}")
    fig, (ax,) = _figure(1, width=5.6, height=3.8)
    for i, (label, points) in enumerate(curves.items()):
        rates, meds, los, his = zip(*_check_points(label, points), strict=True)
        color = f"C{i % 10}"
        ax.plot(rates, meds, marker="o", color=color, label=str(label))
        ax.fill_between(rates, los, his, color=color, alpha=0.2, linewidth=0)
        if label in goodputs:
            ax.axvline(goodputs[label], color=color, linestyle=":",
                       label=f"{label} goodput {goodputs[label]:.3g} req/s")
    ax.axhline(target, color="0.4", linestyle="--", label=f"target {target:.0%}")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("SLO attainment (fraction of requests)")
    _legend(ax, loc="lower left")
    ax.set_title(title or "SLO attainment vs request rate")
    return fig


def _values(label: str, data: LatencyData, metric: str) -> list[float]:
    if isinstance(data, pd.DataFrame):
        if metric not in data.columns:
            raise ValueError(f"frames[{label!r}] has no {metric!r} column; columns: "
                             f"{[str(c) for c in data.columns]}")
        ok = data[data["success"].astype(bool)] if "success" in data.columns else data
        values = pd.to_numeric(ok[metric], errors="coerce").dropna().tolist()
    elif isinstance(data, Mapping):
        if metric not in data:
            raise ValueError(f"frames[{label!r}] has no {metric!r} values; it has "
                             f"{sorted(data)}")
        values = [float(v) for v in data[metric]]
    else:
        values = [float(v) for v in data]
    return sorted(v for v in values if v == v)  # NaN (no value: e.g. one output token) left out


def latency_cdf_plot(frames_or_lists: Mapping[str, LatencyData],
                     metric: str | Sequence[str] = ("ttft_ms", "tpot_ms"), *,
                     title: str | None = None) -> Figure:
    """The empirical CDF of each metric per label, one panel per metric ("ttft_ms",
    "tpot_ms", or any records-frame column). A label's data is a records frame (failed
    requests left out), a {metric: values} mapping, or plain values (one metric only).
    The step of n sorted values v rises to (j + 1) / n at v[j]."""
    metrics = [metric] if isinstance(metric, str) else list(metric)
    if not metrics:
        raise ValueError("metric is empty: give 'ttft_ms', 'tpot_ms' or both")
    if not frames_or_lists:
        raise ValueError("frames_or_lists is empty: give {label: frame or values}")
    plain = [k for k, v in frames_or_lists.items()
             if not isinstance(v, pd.DataFrame | Mapping)]
    if plain and len(metrics) > 1:
        raise ValueError(f"frames_or_lists[{plain[0]!r}] is a plain list of values: give one "
                         f"metric, not {metrics}, or a {{metric: values}} mapping")
    fig, axes = _figure(len(metrics), width=5.0, height=3.8)
    styles = ("-", "--", "-.", ":")
    for ax, name in zip(axes, metrics, strict=True):
        for i, (label, data) in enumerate(frames_or_lists.items()):
            values = _values(str(label), data, name)
            if not values:
                continue
            n = len(values)
            ax.step([values[0], *values], [0.0, *[(j + 1) / n for j in range(n)]],
                    where="post", color=f"C{i % 10}", linestyle=styles[i % len(styles)],
                    label=f"{label} (n={n})")
        if not ax.lines:
            raise ValueError(f"no {name} values in any of {list(frames_or_lists)}")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(_label(name))
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name} CDF")
        _legend(ax, loc="lower right")
    if title:
        fig.suptitle(title)
    return fig


def _split_key(key: str | tuple[int, int]) -> str:
    if isinstance(key, tuple):
        if len(key) != 2:
            raise ValueError(f"measured key {key!r} must be (P, M) or 'P:M'")
        return f"{key[0]}:{key[1]}"
    return str(key)


def pd_ratio_plot(result: PDRatio, measured: Mapping[str | tuple[int, int], float] | None = None,
                  *, title: str | None = None) -> Figure:
    """Sustainable request rate per split P:M (x: the splits in order of P): the prefill
    pool (dashed), the decode pool (dash-dot), the link (dotted, when given) and the system,
    their minimum (solid, markers), with the best split starred and the colocated rate as a
    grey line (and the request rate, when given, as a red one). `measured`: goodput per
    layout, keyed "P:M" or (P, M), drawn as black crosses at its split; the key "colocated"
    is drawn as a grey dash-dot line."""
    labels = [s.label for s in result.splits]
    xs = list(range(len(labels)))
    fig, (ax,) = _figure(1, width=max(5.0, 0.6 * len(labels) + 2.5), height=3.8)
    ax.plot(xs, [s.prefill_rate for s in result.splits], linestyle="--", color="C0",
            label="prefill pool")
    ax.plot(xs, [s.decode_rate for s in result.splits], linestyle="-.", color="C1",
            label="decode pool")
    if result.transfer_s is not None:  # then every split has its link rate
        ax.plot(xs, [s.link_rate for s in result.splits if s.link_rate is not None],
                linestyle=":", color="C4", label="KV link")
    ax.plot(xs, [s.system_rate for s in result.splits], marker="o", color="C2",
            label="system (min)")
    best = labels.index(result.best.label)
    ax.plot([best], [result.best.system_rate], marker="*", markersize=14, color="C3",
            linestyle="none", label=f"best {result.best.label}")
    ax.axhline(result.colocated_rate, color="0.5", linestyle="-",
               label=f"colocated x{result.num_workers}")
    if result.request_rate is not None:
        ax.axhline(result.request_rate, color="red", linestyle="--", linewidth=1,
                   label=f"request rate {result.request_rate:g}")
    if measured:
        keyed = {_split_key(k): float(v) for k, v in measured.items()}
        colocated = keyed.pop("colocated", None)
        unknown = sorted(set(keyed) - set(labels))
        if unknown:
            raise ValueError(f"measured splits {unknown} are not among {labels} (or "
                             "'colocated')")
        if keyed:
            order = [k for k in labels if k in keyed]
            ax.plot([labels.index(k) for k in order], [keyed[k] for k in order], marker="x",
                    markersize=9, color="black", linestyle="none", label="measured goodput")
        if colocated is not None:
            ax.axhline(colocated, color="0.3", linestyle="-.", label="measured colocated")
    ax.set_xticks(xs, labels)
    ax.set_xlabel("split P:M (prefill : decode instances)")
    ax.set_ylabel("sustainable rate (req/s)")
    ax.set_ylim(bottom=0)
    _legend(ax, loc="best")
    ax.set_title(title or f"P:D split of {result.num_workers} instances")
    return fig
