"""The workbench's standard plots: each takes a frame and returns a matplotlib Figure.

Figures are built on the Agg canvas (`matplotlib.figure.Figure` + `FigureCanvasAgg`, never
pyplot), so nothing opens a window, nothing touches global pyplot state, and the same call
works in a test, a script or a notebook (a notebook displays the returned Figure after
`%matplotlib inline`). `save(fig, path)` writes it.

    latency_ecdf      {label: records_frame} -> ECDF of one per-request latency (or ITL gaps)
    sweep_tradeoff    runs frame -> each y vs the swept variable, plus y0-vs-y1 trade-off
    experiment_sweep  a `workbench run`'s rows -> its plots/sweep.png (objective + a tail)
    sweep_metrics     a `workbench sweep`'s points -> its sweep.png (each declared metric)
    saturation_curve  runs frame -> throughput / latency vs concurrency, knee at max_num_seqs
    step_series       step trace -> tokens per step, running/waiting, KV usage over time
    compare_plot      compare_frame -> relative change per metric with the noise band
    bar_compare, grid_heatmap, memory_split   small helpers for the notebooks' tables

Axis labels carry the metric registry's unit ("p95_ttft_ms (ms)", "output_throughput
(tok/s)"); other columns keep their name. Column names may be given bare: "p95_ttft_ms"
finds "metrics.p95_ttft_ms", "max_num_batched_tokens" finds
"params.engine.max_num_batched_tokens" (see `column`).
Repeats are collapsed to their median; the band drawn around a line is their full range.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from workbench.experiments.labels import short_name, short_value, value_label
from workbench.metrics.registry import SLO_BOUNDS, axis_label
from workbench.metrics.registry import spec as metric_spec

log = logging.getLogger(__name__)


def column(frame: pd.DataFrame, name: str) -> str:
    """The column of `frame` meant by `name`: itself, metrics./params./tags.<name>, or the
    one column ending in ".<name>"."""
    if name in frame.columns:
        return name
    for prefix in ("metrics.", "params.", "tags."):
        if prefix + name in frame.columns:
            return prefix + name
    matches = [str(c) for c in frame.columns if str(c).endswith("." + name)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ValueError(f"column {name!r} is ambiguous: {matches}; pass the full name")
    raise ValueError(f"column {name!r} is not in the frame (nor metrics./params./tags."
                     f"{name}); columns: {[str(c) for c in frame.columns]}")


def _figure(ncols: int, nrows: int = 1, width: float = 4.4, height: float = 3.4,
            sharex: bool = False) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    with sns.axes_style("whitegrid"):
        axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
    return fig, [ax for row in axes for ax in row]


def _numeric_or_text(values: pd.Series) -> pd.Series:
    nums = pd.to_numeric(values, errors="coerce")
    return nums if nums.notna().all() else values.astype(str)


def _label(name: str) -> str:
    """The axis label of a column: the registry's `name (unit)`, else a unit read from a
    `_ms` / `_s` / `_tok_s` suffix, else the name."""
    label = axis_label(name)
    if label != name:
        return label
    bare = name.rsplit(".", 1)[-1]
    for suffix, unit in (("_tok_s", "tok/s"), ("_ms", "ms"), ("_s", "s")):
        if bare.endswith(suffix):
            return f"{bare} ({unit})"
    return bare


def _value_labels(name: str, values: pd.Series, bare: bool = False) -> list[str]:
    """Short labels for a column of a variable's values (never a dict repr): `k=5`,
    `budget=64`; `bare` drops the name (`64`, `on`) where the axis or legend names it."""
    distinct = list({_key(v): v for v in values}.values())
    if bare:
        return [short_value(name, v, distinct) for v in values]
    return [value_label(name, v, distinct) for v in values]


def _skip(kind: str, reason: str) -> None:
    log.info("%s: nothing to plot (%s); no figure", kind, reason)


def _legend(ax: Axes, **kwargs: Any) -> None:
    """A legend only when something on `ax` carries a label (no empty legend box)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, fontsize=kwargs.pop("fontsize", 7), **kwargs)


def _integer_ticks(ax: Axes, values: pd.Series, axis: str = "x") -> None:
    """Whole-number ticks for an integer knob (no 1.5 requests on an axis)."""
    nums = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    if len(nums) and (nums == nums.round()).all():
        getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def _auto_log2(ax: Axes, xs: pd.Series, logx: bool | None) -> None:
    if not pd.api.types.is_numeric_dtype(xs) or xs.empty:
        return
    if logx is None:
        logx = bool(xs.min() > 0 and xs.max() / xs.min() >= 8)
    if logx:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(xs.tolist()))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    else:
        _integer_ticks(ax, xs)


def _long(frame: pd.DataFrame, x: str, ys: Sequence[str]) -> pd.DataFrame:
    data = pd.DataFrame({x: _numeric_or_text(frame[column(frame, x)])})
    for y in ys:
        data[y] = pd.to_numeric(frame[column(frame, y)], errors="coerce")
    return data.dropna(subset=[x]).reset_index(drop=True)


def slo_bounds(slo: Mapping[str, float] | None) -> dict[str, float]:
    """A template's `slo` block as {bounded metric: bound} (`max_error_rate` bounds
    `error_rate`; see metric_registry.SLO_BOUNDS); metric names pass through."""
    return {SLO_BOUNDS.get(k, k): float(v) for k, v in (slo or {}).items() if v is not None}


def _slo_line(ax: Axes, metric: str, slo: Mapping[str, float] | None,
              values: Sequence[float], *, note: bool = True) -> None:
    """A labelled dashed line at the metric's SLO bound; a bound far outside the data (it
    would squash the curve to a line) is written in the corner instead."""
    bare = metric.rsplit(".", 1)[-1]
    bound = slo_bounds(slo).get(bare)
    if bound is None:
        return
    row = metric_spec(bare)
    unit = f" {row.unit}" if row is not None and row.unit not in ("1", "") else ""
    text = f"SLO {bare} \u2264 {bound:g}{unit}"
    vals = [float(v) for v in values if pd.notna(v)]
    lo, hi = (min(vals), max(vals)) if vals else (bound, bound)
    span = max(hi - lo, 0.1 * abs(hi), 1e-9)
    if lo - 3 * span <= bound <= hi + 3 * span:
        ax.axhline(bound, color="tab:red", linestyle="--", linewidth=1.2, label=text)
    elif note:  # as a small title, where no legend or data can cover it
        where = "above" if bound > hi else "below"
        ax.set_title(f"{text}: {where} the plotted range", loc="left", fontsize=7,
                     color="tab:red")


def _key(value: Any) -> tuple[str, Any]:
    """A hashable identity for a variable value: numbers by value (MLflow's "512" == 512),
    dicts by their JSON, None / NaN as one "none"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ("none", None)
    if isinstance(value, Mapping):
        return ("dict", json.dumps(value, sort_keys=True, default=str))
    if not isinstance(value, bool):
        try:
            return ("num", float(value))
        except (TypeError, ValueError):
            pass
    return ("text", str(value))


_NO_BASELINE = object()


def _natural(text: str) -> list[Any]:
    """Sort key: "k=3" before "k=12"."""
    return [(0, float(p)) if p.replace(".", "", 1).isdigit() else (1, p)
            for p in re.split(r"(\d+(?:\.\d+)?)", text) if p]


def _plottable(plot: str, frame: pd.DataFrame, x: str, ys: Sequence[str], baseline: Any
               ) -> tuple[pd.DataFrame, dict[float, str], bool] | None:
    """`_sweep_data` without the rows that have none of `ys`; None (the reason logged)
    when nothing is left to draw."""
    if not len(frame):
        _skip(plot, "empty frame")
        return None
    data, ticks, numeric = _sweep_data(frame, x, ys, baseline)
    data = data.dropna(subset=list(ys), how="all")
    if data.empty:
        _skip(plot, f"no values of {list(ys)}")
        return None
    return data, ticks, numeric


def _sweep_data(frame: pd.DataFrame, x: str, ys: Sequence[str],
                baseline: Any) -> tuple[pd.DataFrame, dict[float, str], bool]:
    """Rows (pos, is_base, *ys), tick text per position, and whether x is numeric. A
    non-numeric variable (dicts, text, None) becomes categories 0..n-1, baseline first,
    labelled by `workbench.experiments.labels.value_label`; the baseline is `baseline`,
    else the rows tagged value=baseline (runner child runs)."""
    raw = list(frame[column(frame, x)])
    keys = [_key(v) for v in raw]
    if baseline is not _NO_BASELINE:
        base_key: tuple[str, Any] | None = _key(baseline)
    elif "tags.value" in frame.columns and (frame["tags.value"] == "baseline").any():
        base_key = keys[list(frame["tags.value"] == "baseline").index(True)]
    else:
        base_key = None
    numeric = bool(keys) and all(k[0] == "num" for k in keys)
    values = {k: v for k, v in zip(keys, raw, strict=True)}
    order = list(dict.fromkeys(keys))
    if numeric:
        pos = {k: float(k[1]) for k in order}
    else:
        labels = {k: value_label(x.rsplit(".", 1)[-1], values[k], list(values.values()))
                  for k in order}
        order.sort(key=lambda k: (k != base_key, _natural(labels[k])))
        pos = {k: float(i) for i, k in enumerate(order)}
    all_values = [values[k] for k in order]
    bare = x.rsplit(".", 1)[-1]  # params.engine.max_num_batched_tokens -> budget=...
    ticks = {pos[k]: value_label(bare, values[k], all_values) for k in order}
    data = pd.DataFrame({"pos": [pos[k] for k in keys],
                         "is_base": [k == base_key for k in keys]})
    for y in ys:
        data[y] = pd.to_numeric(frame[column(frame, y)], errors="coerce").to_numpy()
    return data, ticks, numeric


def _measured_panel(ax: Axes, data: pd.DataFrame, y: str, ticks: Mapping[float, str],
                    numeric: bool, *, color: str = "C0") -> None:
    """Median over repeats per x (line for a numeric x, points for categories), the
    repeats' range as a band / error bar, the repeats as faint dots, the baseline starred."""
    rows = data.dropna(subset=[y])
    agg = rows.groupby("pos", sort=True)[y].agg(["median", "min", "max", "count"])
    repeats = int(agg["count"].max()) if len(agg) else 0
    label = f"median of {repeats} repeats" if repeats > 1 else "measured"
    if numeric:
        ax.plot(agg.index, agg["median"], marker="o", color=color, label=label, zorder=3)
        if repeats > 1:
            ax.fill_between(agg.index, agg["min"], agg["max"], color=color, alpha=0.2,
                            linewidth=0, label="range of repeats")
    else:
        err = [agg["median"] - agg["min"], agg["max"] - agg["median"]]
        ax.errorbar(agg.index, agg["median"], yerr=err if repeats > 1 else None, fmt="o",
                    color=color, capsize=4, label=label + (" (bar: range)" if repeats > 1
                                                           else ""), zorder=3)
    if repeats > 1:  # the repeats themselves, dodged a little so they don't hide each other
        step = (0.0 if numeric else 0.08)
        offs = rows.groupby("pos").cumcount() - (rows.groupby("pos")[y].transform("count") - 1) / 2
        ax.scatter(rows["pos"] + step * offs, rows[y], s=12, color=color, alpha=0.35,
                   linewidths=0, zorder=2)
    base = rows[rows["is_base"]]
    if len(base):
        p = float(base["pos"].iloc[0])
        ax.scatter([p], [base[y].median()], marker="*", s=180, color="tab:red",
                   edgecolors="black", linewidths=0.5, zorder=4,
                   label=f"{ticks.get(p, 'baseline')} (baseline)")


def _sweep_x_axis(ax: Axes, data: pd.DataFrame, x: str, ticks: Mapping[float, str],
                  numeric: bool, logx: bool | None) -> None:
    if numeric:
        _auto_log2(ax, data["pos"], logx)
        ax.set_xlabel(_label(x))
        return
    base = set(data.loc[data["is_base"], "pos"])
    texts = [t + ("\n(baseline)" if p in base else "") for p, t in ticks.items()]
    rotate = max((len(t) for t in ticks.values()), default=0) * len(ticks) > 36
    ax.set_xticks(list(ticks), texts, rotation=30 if rotate else 0,
                  ha="right" if rotate else "center", fontsize=8)
    ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.set_xlabel(x.rsplit(".", 1)[-1])


def latency_ecdf(records_frames: Mapping[str, pd.DataFrame], metric: str = "ttft_ms",
                 *, title: str | None = None) -> Figure | None:
    """ECDF of `metric` (a records_frame column, or "itl_ms": every gap between streamed
    chunks) over the successful requests of each labelled run (one colour and line style
    per run, so overlapping curves stay apart). None when no run has a value."""
    series: dict[str, list[float]] = {}
    for label, frame in records_frames.items():
        ok = frame[frame["success"].astype(bool)] if "success" in frame.columns else frame
        if metric == "itl_ms" and metric not in ok.columns:
            values = [1000.0 * (b - a) for times in ok["chunk_times_s"]
                      for a, b in _pairs(times)]
        else:
            values = pd.to_numeric(ok[metric], errors="coerce").dropna().tolist()
        if values:
            series[str(label)] = sorted(values)
    if not series:
        _skip("latency_ecdf", f"no {metric} values in {list(records_frames)}")
        return None
    fig, (ax,) = _figure(1, width=5.6, height=3.8)
    styles = ("-", "--", "-.", ":")
    for i, (label, values) in enumerate(series.items()):
        n = len(values)
        ax.step([values[0], *values], [0.0, *[(j + 1) / n for j in range(n)]], where="post",
                color=f"C{i % 10}", linestyle=styles[i % len(styles)], alpha=0.85,
                label=f"{label} (n={n})")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(_label(metric))
    ax.set_ylabel("fraction of ITL gaps" if metric == "itl_ms" else "fraction of requests")
    _legend(ax, title="run", loc="lower right")
    ax.set_title(title or f"{metric} ECDF")
    return fig


def _pairs(times: Any) -> list[tuple[float, float]]:
    seq = json.loads(times) if isinstance(times, str) else list(times)
    return list(zip(seq, seq[1:], strict=False))


def sweep_tradeoff(frame: pd.DataFrame, x: str, ys: Sequence[str] = ("p95_ttft_ms", "p95_itl_ms"),
                   *, baseline: Any = _NO_BASELINE, slo: Mapping[str, float] | None = None,
                   logx: bool | None = None, title: str | None = None) -> Figure | None:
    """Each y against the swept variable `x` (median over repeats, band / bar = their
    range, the repeats as dots); with two ys a third panel plots ys[1] against ys[0], one
    point per x value: the trade-off curve.

    `baseline`: the baseline's value of `x` (starred, "(baseline)" in its label); by default
    the rows tagged value=baseline. `slo`: a template's slo block; a plotted metric with a
    bound gets a labelled line. A numeric x is a line (log2 axis when it spans >= 8x, whole
    ticks for an integer knob); anything else (a dict such as speculative_config, text,
    None) is categorical with short labels (`workbench.experiments.labels.value_label`:
    "k=5", "spec=off"). None when no row
    has a value to plot."""
    prepared = _plottable("sweep_tradeoff", frame, x, ys, baseline)
    if prepared is None:
        return None
    data, ticks, numeric = prepared
    trade = len(ys) == 2
    fig, axes = _figure(len(ys) + trade)
    for ax, y in zip(axes, ys, strict=False):
        _measured_panel(ax, data, y, ticks, numeric)
        _slo_line(ax, y, slo, data[y].tolist())
        _sweep_x_axis(ax, data, x, ticks, numeric, logx)
        ax.set_ylabel(_label(y))
        _legend(ax, loc="best")
    if trade:
        ax = axes[-1]
        med = data.groupby("pos", sort=True)[list(ys)].median().dropna()
        if numeric:
            ax.plot(med[ys[0]], med[ys[1]], color="C0", alpha=0.6, zorder=2)
        ax.scatter(med[ys[0]], med[ys[1]], color="C0", zorder=3)
        base = set(data.loc[data["is_base"], "pos"]) & set(med.index)
        for p, row in med.iterrows():
            ax.annotate(ticks.get(float(p), str(p)) + (" (baseline)" if p in base else ""),
                        (row[ys[0]], row[ys[1]]), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
        if base:
            b = med.loc[sorted(base)]
            ax.scatter(b[ys[0]], b[ys[1]], marker="*", s=180, color="tab:red",
                       edgecolors="black", linewidths=0.5, zorder=4, label="baseline")
        _slo_line(ax, ys[1], slo, med[ys[1]].tolist(), note=False)
        ax.margins(0.15)
        ax.set_xlabel(_label(ys[0]))
        ax.set_ylabel(_label(ys[1]))
        ax.set_title(f"trade-off (medians; labels: {x.rsplit('.', 1)[-1]})", fontsize=9)
        _legend(ax, loc="best")
    fig.suptitle(title or f"sweep over {x.rsplit('.', 1)[-1]}")
    return fig


def experiment_sweep(rows: Sequence[Mapping[str, Any]], variable: str, baseline: Any,
                     objective: str, slo: Mapping[str, float] | None = None,
                     *, title: str | None = None) -> Figure | None:
    """`workbench run`'s plots/sweep.png: one row per measured run ({variable: value,
    **metrics}; the baseline's rows hold `baseline`, which may be None or a dict); the
    objective and a tail metric against the variable, baseline starred, SLO bounds drawn,
    band = range of repeats, then the trade-off of the two. The tail is the first
    SLO-bounded latency the rows carry (else p95_ttft_ms, or output_throughput when that is
    the objective). None (with a logged reason) when there is nothing to draw."""
    have = set.intersection(*(set(r) for r in rows)) if rows else set()
    bounded = [m for m in slo_bounds(slo) if m.endswith("_ms") and m != objective]
    tails = [*bounded, "p95_ttft_ms" if objective != "p95_ttft_ms" else "output_throughput"]
    tail = next((m for m in tails if m in have), None)
    if objective not in have or tail is None:
        _skip("experiment_sweep", f"the runs lack {objective} or a tail metric ({tails})")
        return None
    frame = pd.DataFrame({variable: pd.Series([r[variable] for r in rows], dtype=object),
                          objective: [r[objective] for r in rows],
                          tail: [r[tail] for r in rows]})
    return sweep_tradeoff(frame, x=variable, ys=(objective, tail), baseline=baseline, slo=slo,
                          title=title)


def saturation_curve(frame: pd.DataFrame, x: str = "concurrency",
                     ys: Sequence[str] = ("output_throughput", "p95_tpot_ms"),
                     knee: float | None = None, *, slo: Mapping[str, float] | None = None,
                     title: str | None = None) -> Figure | None:
    """Each y against closed-loop concurrency (median, band = range of repeats); a dashed
    line marks the knee (max_num_seqs), a red one a metric's SLO bound. None when empty."""
    prepared = _plottable("saturation_curve", frame, x, ys, None)
    if prepared is None:
        return None
    data, ticks, numeric = prepared
    fig, axes = _figure(len(ys))
    for ax, y in zip(axes, ys, strict=False):
        _measured_panel(ax, data, y, ticks, numeric)
        _slo_line(ax, y, slo, data[y].tolist())
        _sweep_x_axis(ax, data, x, ticks, numeric, None)
        if knee is not None and numeric:
            ax.axvline(knee, color="tab:gray", linestyle="--", label=f"max_num_seqs = {knee:g}")
        ax.set_ylabel(_label(y))
        _legend(ax, loc="best")
    fig.suptitle(title or f"saturation: metrics vs {x.rsplit('.', 1)[-1]}")
    return fig


def step_series(step_trace: pd.DataFrame | Sequence[Mapping[str, Any]],
                *, title: str | None = None) -> Figure | None:
    """Per engine step: prefill/decode tokens, running/waiting requests (preemptions marked)
    and KV cache usage, against time_s (or the step index)."""
    trace = step_trace if isinstance(step_trace, pd.DataFrame) else pd.DataFrame(step_trace)
    if trace.empty:
        _skip("step_series", "empty step trace")
        return None
    x = "time_s" if "time_s" in trace.columns else "step"
    fig, axes = _figure(1, nrows=3, width=7.0, height=2.2, sharex=True)
    series = [(("prefill_tokens", "decode_tokens"), "tokens per step"),
              (("running", "waiting"), "requests"), (("kv_cache_usage_perc",), "KV cache usage")]
    for ax, (cols, ylabel) in zip(axes, series, strict=True):
        for c in cols:
            if c in trace.columns:
                ax.plot(trace[x], trace[c], label=c, drawstyle="steps-post", linewidth=1)
        ax.set_ylabel(ylabel)
        if cols[0] != "kv_cache_usage_perc":
            _integer_ticks(ax, pd.concat([trace[c] for c in cols if c in trace.columns]
                                         or [pd.Series([], dtype=float)]), axis="y")
    if "preemptions" in trace.columns and (trace["preemptions"] > 0).any():
        hit = trace[trace["preemptions"] > 0]
        axes[1].scatter(hit[x], hit["running"], marker="x", color="tab:red", label="preemption")
    for ax in axes:
        _legend(ax, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[-1].set_xlabel(_label(x))
    fig.suptitle(title or f"engine step trace ({len(trace)} steps)")
    return fig


def compare_plot(compare: pd.DataFrame, *, title: str | None = None) -> Figure | None:
    """compare_frame rows as % change of the median vs the baseline: one row per metric, one
    colour per variant, marker = verdict; the line through a point is the noise band (a
    change counts only when the band excludes 0). None for an empty frame."""
    if compare.empty:
        _skip("compare_plot", "empty compare frame")
        return None
    metrics = list(dict.fromkeys(compare["metric"]))
    variable = str(compare["variable"].iloc[0])
    data = compare.assign(value=_value_labels(variable, compare["value"]))
    values = list(dict.fromkeys(data["value"]))
    base = data["baseline_median"].where(data["baseline_median"] != 0)
    for col in ("delta", "noise_low", "noise_high"):
        data[f"{col}_pct"] = 100.0 * data[col] / base
    step = 0.7 / max(1, len(values))
    data["pos"] = [metrics.index(m) - 0.35 + step * (values.index(v) + 0.5)
                   for m, v in zip(data["metric"], data["value"], strict=True)]
    fig, (ax,) = _figure(1, width=7.0, height=0.5 * len(metrics) + 1.8)
    palette = dict(zip(values, sns.color_palette(n_colors=max(1, len(values))), strict=False))
    ax.hlines(data["pos"], data["noise_low_pct"], data["noise_high_pct"],
              colors=[palette[v] for v in data["value"]], linewidth=2, alpha=0.6)
    sns.scatterplot(data=data, x="delta_pct", y="pos", hue="value", style="verdict",
                    palette=palette, s=60, ax=ax,
                    style_order=[v for v in ("better", "no change", "worse", "undecided",
                                             "lower", "higher")
                                 if v in set(data["verdict"])])
    ax.set_yticks(range(len(metrics)), [_label(m) for m in metrics])
    ax.set_ylim(len(metrics) - 0.5, -0.5)
    ax.set_xlabel("change vs baseline median (%)")
    ax.set_ylabel("metric")
    ax.axvline(0, color="black", linewidth=0.8, label="baseline median")
    _legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    name = short_name(variable) if variable else "variants"
    ax.set_title(title or f"{name} vs baseline (line: noise band)")
    return fig


def bar_compare(frame: pd.DataFrame, x: str, y: str, hue: str | None = None,
                col: str | None = None, *, title: str | None = None) -> Figure | None:
    """Median `y` per `x` (bars coloured by `hue`), one panel per value of `col`. None for
    an empty frame."""
    if frame.empty:
        _skip("bar_compare", "empty frame")
        return None
    labelled = frame.assign(**{c: _value_labels(c, frame[c], bare=c != col)
                               for c in dict.fromkeys((x, hue, col)) if c})
    panels = list(dict.fromkeys(labelled[col])) if col else [None]
    fig, axes = _figure(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        data = labelled if panel is None else labelled[labelled[col] == panel]
        sns.barplot(data=data, x=x, y=y, hue=hue, estimator="median", errorbar=None, ax=ax)
        ax.set_xlabel(_label(x))
        ax.set_ylabel(_label(y))
        if hue:
            _legend(ax, title=short_name(hue), fontsize=8)
        if panel is not None:
            ax.set_title(panel)
    if title:
        fig.suptitle(title)
    return fig


def grid_heatmap(frame: pd.DataFrame, x: str, y: str, value: str, *, fmt: str = ".0f",
                 title: str | None = None) -> Figure | None:
    """`value` over the grid of `x` by `y`, annotated. None when the grid is empty."""
    grid = frame.pivot_table(index=y, columns=x, values=value, aggfunc="median")
    if grid.empty:
        _skip("grid_heatmap", "empty grid")
        return None
    fig, (ax,) = _figure(1, width=5.6, height=3.8)
    sns.heatmap(grid, annot=True, fmt=fmt, cmap="viridis", ax=ax,
                cbar_kws={"label": axis_label(value)})
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    ax.set_title(title or value)
    return fig


def memory_split(parts: pd.DataFrame, *, unit: str = "MiB",
                 title: str | None = None) -> Figure | None:
    """Stacked horizontal bars: one bar per row, one segment per column (bytes). None when
    empty."""
    if parts.empty:
        _skip("memory_split", "empty frame")
        return None
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
    fig, (ax,) = _figure(1, width=7.0, height=0.6 * len(parts) + 1.8)
    left = pd.Series(0.0, index=parts.index)
    labels = [str(i) for i in parts.index]
    for name, color in zip(parts.columns, sns.color_palette(n_colors=len(parts.columns)),
                           strict=True):
        widths = parts[name].astype(float) / scale
        ax.barh(labels, widths, left=left, label=str(name), color=color)
        left = left + widths
    ax.set_xlabel(f"memory ({unit})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "memory split")
    return fig


def speedup_vs_k(frame: pd.DataFrame, title: str | None = None) -> Figure | None:
    """Measured (solid, circles) and predicted (dashed, crosses, nudged right so the two
    don't hide each other) speed-up against k, one colour per concurrency; the band is the
    range over timed runs (`speedup_low`..`speedup_high`, when the frame has them); the
    grey line at 1.0 is the baseline, k = 0 (no speculation). None when nothing measured."""
    if frame.empty or pd.to_numeric(frame["speedup"], errors="coerce").isna().all():
        _skip("speedup_vs_k", "no measured speed-up")
        return None
    fig, (ax,) = _figure(1, width=5.6)
    ax.axhline(1.0, color="grey", lw=0.8, label="k=0, no speculation (baseline)")
    groups = list(frame.sort_values("k").groupby("concurrency"))
    for i, (c, grp) in enumerate(groups):
        color = f"C{i % 10}"
        ax.plot(grp["k"], grp["speedup"], marker="o", color=color, label=f"C={c} measured",
                zorder=3)
        if {"speedup_low", "speedup_high"} <= set(grp.columns) and \
                grp[["speedup_low", "speedup_high"]].notna().all(axis=None):
            ax.fill_between(grp["k"], grp["speedup_low"], grp["speedup_high"], color=color,
                            alpha=0.15, linewidth=0, label=f"C={c} range of runs")
        ax.plot(grp["k"] + 0.04 * (i + 1), grp["predicted_speedup"], ls="--", marker="x",
                color=color, alpha=0.75, label=f"C={c} predicted")
    _integer_ticks(ax, frame["k"])
    ax.set_xlabel("num_speculative_tokens (k)")
    ax.set_ylabel("output tok/s vs no speculation (x)")
    _legend(ax, fontsize=7, loc="best")
    fig.suptitle(title or "speed-up vs k")
    return fig


def acceptance_by_position(frame: pd.DataFrame, title: str | None = None) -> Figure | None:
    """P(draft position i accepted), per-position counter / drafts: one line per row, one
    colour per k and one marker and line style per concurrency. Greedy acceptance rarely
    depends on the batch, and a position's acceptance barely on k, so series often
    coincide: each is nudged sideways by its own few hundredths of a position (no two share
    a point), the longer k drawn first. None when no row drafted anything (k = 0)."""
    rows = [row for _, row in frame.iterrows()
            if len(row.get("acceptance_by_position", None) or [])] if len(frame) else []
    if not rows:
        _skip("acceptance_by_position", "no drafts (k = 0 or no speculative run)")
        return None
    fig, (ax,) = _figure(1, width=5.6)
    markers, styles = ("o", "s", "^", "D", "v", "P"), ("-", "--", ":", "-.")
    ks = sorted({row["k"] for row in rows})
    cs = sorted({row["concurrency"] for row in rows})
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["k"], rows[i]["concurrency"]))
    step = min(0.05, 0.3 / len(rows))
    for n, i in sorted(enumerate(order), key=lambda t: -rows[t[1]]["k"]):
        row, j = rows[i], cs.index(rows[i]["concurrency"])
        acc = list(row["acceptance_by_position"])
        nudge = step * (n - (len(rows) - 1) / 2)
        ax.plot([p + nudge for p in range(len(acc))], acc,
                marker=markers[j % len(markers)], ls=styles[j % len(styles)],
                color=f"C{ks.index(row['k']) % 10}", alpha=0.85, markersize=5,
                markerfacecolor="none" if j % 2 else None,
                label=f"k={row['k']} C={row['concurrency']}")
    handles, labels = ax.get_legend_handles_labels()  # legend in (k, C) order
    pairs = sorted(zip(labels, handles, strict=True), key=lambda t: _natural(t[0]))
    ax.legend([h for _, h in pairs], [lab for lab, _ in pairs], fontsize=7, loc="best")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts (fraction)")
    ax.set_ylim(0, 1.05)
    fig.suptitle(title or "acceptance by position")
    return fig


def sweep_metrics(frame: pd.DataFrame, x: str, ys: Sequence[str], *,
                  title: str | None = None) -> Figure | None:
    """`workbench sweep`'s sweep.png: each metric of `ys` against the swept value `x`, one
    panel per metric (at most 6), one point per point of the sweep. Rows whose `valid`
    column is False (a disturbed point) are drawn apart as grey crosses, never on the line.
    A numeric x is a line; anything else categorical with short labels. None when no row
    has a value of `ys`."""
    ys = list(ys)[:6]
    prepared = _plottable("sweep_metrics", frame, x, ys, None)
    if prepared is None:
        return None
    data, ticks, numeric = prepared
    valid = (frame["valid"].fillna(True).astype(bool).to_numpy() if "valid" in frame.columns
             else [True] * len(frame))
    data = data.assign(valid=pd.Series(valid, index=frame.index).loc[data.index].to_numpy())
    fig, axes = _figure(min(3, len(ys)), nrows=math.ceil(len(ys) / 3), sharex=True)
    for ax, y in zip(axes, ys, strict=False):
        good, bad = data[data["valid"]], data[~data["valid"]].dropna(subset=[y])
        if good[y].notna().any():
            _measured_panel(ax, good, y, ticks, numeric)
        if len(bad):
            ax.scatter(bad["pos"], bad[y], marker="x", color="grey", zorder=2,
                       label="INVALID (disturbed; not read)")
        _sweep_x_axis(ax, data, x, ticks, numeric, None)
        ax.set_ylabel(_label(y))
        _legend(ax, loc="best")
    for ax in axes[len(ys):]:
        ax.set_visible(False)
    fig.suptitle(title or f"sweep over {x}")
    return fig


def save(fig: Figure | None, path: str | Path, dpi: int = 120) -> Path:
    """Write `fig` (format from the suffix, e.g. .png / .svg / .pdf), creating parent dirs.
    Refuses (ValueError) None or a figure with nothing drawn: never an empty picture."""
    if fig is None:
        raise ValueError(f"no figure to save as {path}: the plot had no data")
    if not any(ax.has_data() for ax in fig.axes):
        raise ValueError(f"refusing to save an empty figure as {path}: no axes has data")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, bbox_inches="tight")
    return out
