"""Speculative-decoding read-outs for notebooks: frames, headline metrics and two plots.

    spec_frame(points, k)            SpecPoints of one k -> one row per concurrency
    reference_frame(concurrencies)   k = 0's rows: speculation off against itself
    spec_metrics(frame)              -> {"speedup_c1": .., "acceptance_rate_c1": .., ...}
    sweep_spec_frame(uri, run_id)    a `workbench sweep` point's sibling runs -> rows (k, c)
    speedup_vs_k(frame)              measured (solid, band = range of timed runs) and
                                     predicted (dashed) speed-up vs k   (workbench.analysis.plots)
    acceptance_by_position(frame)    P(position i accepted | drafted), one line per row; None
                                     at k = 0                          (workbench.analysis.plots)
    sweep_curve(frame, metrics, ...) inside a sweep point: log, then every point so far

The points are measured through the runner (`workbench.experiments.studies.speculation`:
one experiment per concurrency, speculation off against on at k); `harness.spec_points`
defines them.

A sweep over `num_speculative_tokens` runs one notebook per k; each publishes
`spec_metrics` into its child run, so the last point can read all of them back
(`sweep_spec_frame`) and draw the curve over k.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from workbench.analysis.plots import acceptance_by_position, speedup_vs_k
from workbench.harness.spec_points import SpecPoint

__all__ = ["acceptance_by_position", "reference_frame", "spec_frame", "spec_metrics",
           "speedup_vs_k", "sweep_curve", "sweep_spec_frame"]

_METRIC = re.compile(r"^metrics\.(speedup|speedup_low|speedup_high|predicted_speedup|"
                     r"acceptance_rate|mean_acceptance_length)_c(\d+)$")
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
            # the noise band: slowest vs fastest timed runs of the two points, and back
            "speedup_low": (p.output_tokens / max(p.run_s))
            / (base.output_tokens / min(base.run_s)) if valid else float("nan"),
            "speedup_high": (p.output_tokens / min(p.run_s))
            / (base.output_tokens / max(base.run_s)) if valid else float("nan"),
            "predicted_speedup": p.predicted_speedup,
            "acceptance_rate": p.acceptance_rate,
            "mean_acceptance_length": p.mean_acceptance_length,
            "identical": True if p.identical is None else p.identical,
            "acceptance_by_position": p.acceptance_by_position,
        })
    return pd.DataFrame(rows)


def reference_frame(concurrencies: list[int]) -> pd.DataFrame:
    """k = 0, one row per concurrency: speculation off against itself (speed-up 1, predicted
    1, nothing drafted). It is the baseline every k > 0 point measures beside itself, so it
    needs no run of its own; its output tok/s is NaN."""
    nan = float("nan")
    return pd.DataFrame([{
        "k": 0, "concurrency": int(c), "config": "off", "output_tok_s": nan, "off_tok_s": nan,
        "valid": True, "speedup": 1.0, "speedup_low": 1.0, "speedup_high": 1.0,
        "predicted_speedup": 1.0, "acceptance_rate": 0.0, "mean_acceptance_length": 1.0,
        "identical": True, "acceptance_by_position": [],
    } for c in concurrencies])


def spec_metrics(frame: pd.DataFrame) -> dict[str, float]:
    out: dict[str, float] = {}
    for _, row in frame.iterrows():
        c = int(row["concurrency"])
        for key in ("speedup", "speedup_low", "speedup_high", "predicted_speedup",
                    "acceptance_rate", "mean_acceptance_length"):
            if key in row.index:
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


def sweep_curve(frame: pd.DataFrame, metrics: dict[str, float], *, mlflow_uri: str = "",
                mlflow_parent_run_id: str = "", mlflow_experiment: str = "notebooks"
                ) -> pd.DataFrame:
    """The rows to draw: inside a `workbench sweep` point (both `mlflow_uri` and
    `mlflow_parent_run_id` given), log `metrics` into the point's run first, then read every
    point finished so far back (`sweep_spec_frame`); standalone, `frame` itself."""
    if not (mlflow_uri and mlflow_parent_run_id):
        return frame
    from workbench.analysis.notebook import publish

    publish("07_speculative_decoding", metrics=metrics, mlflow_uri=mlflow_uri,
            mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)
    return sweep_spec_frame(mlflow_uri, mlflow_parent_run_id)
