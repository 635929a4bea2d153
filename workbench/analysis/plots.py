"""The workbench's standard plots: each takes a frame and returns a matplotlib Figure.

Figures are built on the Agg canvas (`matplotlib.figure.Figure` + `FigureCanvasAgg`, never
pyplot), so nothing opens a window, nothing touches global pyplot state, and the same call
works in a test, a script or a notebook (a notebook displays the returned Figure after
`%matplotlib inline`). `save(fig, path)` writes it.

    latency_ecdf      {label: records_frame} -> ECDF of one per-request latency (or ITL gaps)
    sweep_tradeoff    runs frame -> each y vs the swept variable, plus y0-vs-y1 trade-off
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from workbench.harness.metric_registry import axis_label

_BAND = ("pi", 100)  # the full range of the repeats, like the "spread" noise band


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


def _auto_log2(ax: Axes, xs: pd.Series, logx: bool | None) -> None:
    if not pd.api.types.is_numeric_dtype(xs) or xs.empty:
        return
    if logx is None:
        logx = bool(xs.min() > 0 and xs.max() / xs.min() >= 8)
    if logx:
        ax.set_xscale("log", base=2)
        ticks = sorted(set(xs.tolist()))
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])


def _long(frame: pd.DataFrame, x: str, ys: Sequence[str]) -> pd.DataFrame:
    data = pd.DataFrame({x: _numeric_or_text(frame[column(frame, x)])})
    for y in ys:
        data[y] = pd.to_numeric(frame[column(frame, y)], errors="coerce")
    return data.dropna(subset=[x]).reset_index(drop=True)


def latency_ecdf(records_frames: Mapping[str, pd.DataFrame], metric: str = "ttft_ms",
                 *, title: str | None = None) -> Figure:
    """ECDF of `metric` (a records_frame column, or "itl_ms": every gap between streamed
    chunks) over the successful requests of each labelled run."""
    parts = []
    for label, frame in records_frames.items():
        ok = frame[frame["success"].astype(bool)] if "success" in frame.columns else frame
        if metric == "itl_ms" and metric not in ok.columns:
            values = [1000.0 * (b - a) for times in ok["chunk_times_s"]
                      for a, b in _pairs(times)]
        else:
            values = pd.to_numeric(ok[metric], errors="coerce").dropna().tolist()
        parts.append(pd.DataFrame({metric: values, "run": str(label)}))
    data = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({metric: [], "run": []})
    fig, (ax,) = _figure(1, width=5.6, height=3.8)
    sns.ecdfplot(data=data, x=metric, hue="run", ax=ax)
    ax.set_xlabel(metric)
    ax.set_ylabel("fraction of ITL gaps" if metric == "itl_ms" else "fraction of requests")
    ax.set_title(title or f"{metric} ECDF")
    return fig


def _pairs(times: Any) -> list[tuple[float, float]]:
    seq = json.loads(times) if isinstance(times, str) else list(times)
    return list(zip(seq, seq[1:], strict=False))


def sweep_tradeoff(frame: pd.DataFrame, x: str, ys: Sequence[str] = ("p95_ttft_ms", "p95_itl_ms"),
                   *, logx: bool | None = None, title: str | None = None) -> Figure:
    """Each y against the swept variable `x` (median line, band = range of repeats); with two
    ys a third panel plots ys[1] against ys[0], one point per x value: the trade-off curve."""
    data = _long(frame, x, ys)
    trade = len(ys) == 2
    fig, axes = _figure(len(ys) + trade)
    for ax, y in zip(axes, ys, strict=False):
        sns.lineplot(data=data, x=x, y=y, estimator="median", errorbar=_BAND, marker="o", ax=ax)
        _auto_log2(ax, data[x], logx)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
    if trade:
        ax = axes[-1]
        med = data.groupby(x, sort=True)[list(ys)].median().reset_index()
        ax.plot(med[ys[0]], med[ys[1]], marker="o")
        for _, row in med.iterrows():
            xv = row[x]
            ax.annotate(f"{xv:g}" if isinstance(xv, int | float) else str(xv),
                        (row[ys[0]], row[ys[1]]), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
        ax.set_xlabel(axis_label(ys[0]))
        ax.set_ylabel(axis_label(ys[1]))
        ax.set_title(f"trade-off (labels: {x})", fontsize=9)
    fig.suptitle(title or f"sweep over {x}")
    return fig


def saturation_curve(frame: pd.DataFrame, x: str = "concurrency",
                     ys: Sequence[str] = ("output_throughput", "p95_tpot_ms"),
                     knee: float | None = None, *, title: str | None = None) -> Figure:
    """Each y against closed-loop concurrency; a dashed line marks the knee (max_num_seqs)."""
    data = _long(frame, x, ys)
    fig, axes = _figure(len(ys))
    for ax, y in zip(axes, ys, strict=False):
        sns.lineplot(data=data, x=x, y=y, estimator="median", errorbar=_BAND, marker="o", ax=ax)
        _auto_log2(ax, data[x], None)
        if knee is not None:
            ax.axvline(knee, color="tab:red", linestyle="--", label=f"max_num_seqs = {knee:g}")
            ax.legend(loc="best", fontsize=8)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
    fig.suptitle(title or f"saturation: metrics vs {x}")
    return fig


def step_series(step_trace: pd.DataFrame | Sequence[Mapping[str, Any]],
                *, title: str | None = None) -> Figure:
    """Per engine step: prefill/decode tokens, running/waiting requests (preemptions marked)
    and KV cache usage, against time_s (or the step index)."""
    trace = step_trace if isinstance(step_trace, pd.DataFrame) else pd.DataFrame(step_trace)
    x = "time_s" if "time_s" in trace.columns else "step"
    fig, axes = _figure(1, nrows=3, width=7.0, height=2.2, sharex=True)
    series = [(("prefill_tokens", "decode_tokens"), "tokens per step"),
              (("running", "waiting"), "requests"), (("kv_cache_usage_perc",), "KV cache usage")]
    for ax, (cols, ylabel) in zip(axes, series, strict=True):
        for c in cols:
            if c in trace.columns:
                ax.plot(trace[x], trace[c], label=c, drawstyle="steps-post", linewidth=1)
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    if "preemptions" in trace.columns and (trace["preemptions"] > 0).any():
        hit = trace[trace["preemptions"] > 0]
        axes[1].scatter(hit[x], hit["running"], marker="x", color="tab:red", label="preemption")
        axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    axes[-1].set_xlabel(x)
    fig.suptitle(title or f"engine step trace ({len(trace)} steps)")
    return fig


def compare_plot(compare: pd.DataFrame, *, title: str | None = None) -> Figure:
    """compare_frame rows as % change of the median vs the baseline: one row per metric, one
    colour per variant, marker = verdict; the line through a point is the noise band (a
    change counts only when the band excludes 0)."""
    metrics = list(dict.fromkeys(compare["metric"]))
    values = [str(v) for v in dict.fromkeys(compare["value"])]
    data = compare.assign(value=compare["value"].astype(str))
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
                    style_order=[v for v in ("better", "no change", "worse")
                                 if v in set(data["verdict"])])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(metrics)), metrics)
    ax.set_ylim(len(metrics) - 0.5, -0.5)
    ax.set_xlabel("change vs baseline median (%)")
    ax.set_ylabel("metric")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    variable = str(compare["variable"].iloc[0]) if len(compare) else ""
    ax.set_title(title or f"{variable or 'variants'} vs baseline (line: noise band)")
    return fig


def bar_compare(frame: pd.DataFrame, x: str, y: str, hue: str | None = None,
                col: str | None = None, *, title: str | None = None) -> Figure:
    """Median `y` per `x` (bars coloured by `hue`), one panel per value of `col`."""
    panels = list(dict.fromkeys(frame[col])) if col else [None]
    fig, axes = _figure(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        data = frame if panel is None else frame[frame[col] == panel]
        sns.barplot(data=data, x=x, y=y, hue=hue, estimator="median", errorbar=None, ax=ax)
        ax.set_xlabel(axis_label(x))
        ax.set_ylabel(axis_label(y))
        if panel is not None:
            ax.set_title(f"{col} = {panel}")
    if title:
        fig.suptitle(title)
    return fig


def grid_heatmap(frame: pd.DataFrame, x: str, y: str, value: str, *, fmt: str = ".0f",
                 title: str | None = None) -> Figure:
    """`value` over the grid of `x` by `y`, annotated."""
    grid = frame.pivot_table(index=y, columns=x, values=value, aggfunc="median")
    fig, (ax,) = _figure(1, width=5.6, height=3.8)
    sns.heatmap(grid, annot=True, fmt=fmt, cmap="viridis", ax=ax,
                cbar_kws={"label": axis_label(value)})
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    ax.set_title(title or value)
    return fig


def memory_split(parts: pd.DataFrame, *, unit: str = "MiB", title: str | None = None) -> Figure:
    """Stacked horizontal bars: one bar per row, one segment per column (bytes)."""
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


def save(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write `fig` (format from the suffix, e.g. .png / .svg / .pdf), creating parent dirs."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi, bbox_inches="tight")
    return out
