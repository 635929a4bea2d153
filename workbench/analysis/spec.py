"""Speculative-decoding read-outs for notebooks: frames, headline metrics and two plots.

    spec_frame(points, k)            SpecPoints of one k -> one row per concurrency
    spec_metrics(frame)              -> {"speedup_c1": .., "acceptance_rate_c1": .., ...}
    sweep_spec_frame(uri, run_id)    a `workbench sweep` point's sibling runs -> rows (k, c)
    speedup_vs_k(frame)              measured (solid) and predicted (dashed) speed-up vs k
    acceptance_by_position(frame)    P(position i accepted | drafted), one line per row

A sweep over `num_speculative_tokens` runs one notebook per k; each publishes
`spec_metrics` into its child run, so the last point can read all of them back
(`sweep_spec_frame`) and draw the curve over k.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from workbench.analysis.plots import _figure
from workbench.bench.spec import SpecPoint

_METRIC = re.compile(r"^metrics\.(speedup|predicted_speedup|acceptance_rate|"
                     r"mean_acceptance_length)_c(\d+)$")
_POS = re.compile(r"^metrics\.accepted_pos(\d+)_c(\d+)$")


def spec_frame(points: list[SpecPoint], k: int) -> pd.DataFrame:
    """One row per concurrency: the spec point against the "off" point at that concurrency
    (k = 0: the off point against itself). `valid` is False when other processes disturbed
    either point (`SpecPoint.valid`); its speed-up is then NaN, never a number to read."""
    off = {p.concurrency: p for p in points if p.label == "off"}
    rows = []
    for p in points:
        if (p.label == "off") != (k == 0):
            continue
        base = off[p.concurrency]
        valid = p.valid and base.valid
        rows.append({
            "k": k, "concurrency": p.concurrency, "config": p.label,
            "output_tok_s": p.output_tok_s, "off_tok_s": base.output_tok_s,
            "valid": valid,
            "speedup": p.output_tok_s / base.output_tok_s if valid else float("nan"),
            "predicted_speedup": p.predicted_speedup,
            "acceptance_rate": p.acceptance_rate,
            "mean_acceptance_length": p.mean_acceptance_length,
            "identical": True if p.identical is None else p.identical,
            "acceptance_by_position": p.acceptance_by_position,
        })
    return pd.DataFrame(rows)


def spec_metrics(frame: pd.DataFrame) -> dict[str, float]:
    out: dict[str, float] = {}
    for _, row in frame.iterrows():
        c = int(row["concurrency"])
        for key in ("speedup", "predicted_speedup", "acceptance_rate",
                    "mean_acceptance_length"):
            out[f"{key}_c{c}"] = float(row[key])
        for i, a in enumerate(row["acceptance_by_position"]):
            out[f"accepted_pos{i}_c{c}"] = float(a)
    return out


def sweep_spec_frame(uri: str, run_id: str, param: str = "num_speculative_tokens"
                     ) -> pd.DataFrame:
    """Rows (k, concurrency, speedup, predicted_speedup, acceptance_rate, ...,
    acceptance_by_position) from every finished-or-running sibling of sweep point `run_id`."""
    from mlflow.tracking import MlflowClient

    from workbench.analysis.frames import runs_frame

    parent = MlflowClient(tracking_uri=uri).get_run(run_id).data.tags.get("mlflow.parentRunId")
    if not parent:
        raise ValueError(f"run {run_id!r} is not a sweep point (it has no parent run)")
    runs = runs_frame(None, uri, parent_run_id=parent)
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for _, run in runs.iterrows():
        k = int(float(run[f"params.{param}"]))
        for col, value in run.items():
            if pd.isna(value):
                continue
            if m := _METRIC.match(str(col)):
                row = rows.setdefault((k, int(m[2])), {"k": k, "concurrency": int(m[2]),
                                                       "acceptance_by_position": {}})
                row[m[1]] = float(value)
            elif m := _POS.match(str(col)):
                row = rows.setdefault((k, int(m[2])), {"k": k, "concurrency": int(m[2]),
                                                       "acceptance_by_position": {}})
                row["acceptance_by_position"][int(m[1])] = float(value)
    for row in rows.values():
        pos = row["acceptance_by_position"]
        row["acceptance_by_position"] = [pos[i] for i in sorted(pos)]
    return pd.DataFrame(sorted(rows.values(), key=lambda r: (r["concurrency"], r["k"])))


def speedup_vs_k(frame: pd.DataFrame, title: str | None = None) -> Any:
    """Measured (solid) and predicted (dashed, from forward-pass counts) speed-up against k,
    one colour per concurrency; 1.0 = no speculation."""
    fig, (ax,) = _figure(1, width=5.6)
    for i, (c, grp) in enumerate(frame.sort_values("k").groupby("concurrency")):
        color = f"C{i}"
        ax.plot(grp["k"], grp["speedup"], marker="o", color=color, label=f"C={c} measured")
        ax.plot(grp["k"], grp["predicted_speedup"], ls="--", marker="x", color=color,
                label=f"C={c} predicted")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("num_speculative_tokens (k)")
    ax.set_ylabel("output tok/s vs no speculation")
    ax.legend(fontsize=7)
    fig.suptitle(title or "speed-up vs k")
    return fig


def acceptance_by_position(frame: pd.DataFrame, title: str | None = None) -> Any:
    """P(draft position i accepted), per-position counter / drafts: one line per row."""
    fig, (ax,) = _figure(1, width=5.6)
    for _, row in frame.iterrows():
        acc = list(row["acceptance_by_position"])
        if acc:
            ax.plot(range(len(acc)), acc, marker="o",
                    label=f"k={row['k']} C={row['concurrency']}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafts")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.suptitle(title or "acceptance by position")
    return fig
