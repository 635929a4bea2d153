"""Colocated vs prefill/decode-disaggregated rate sweeps read back from MLflow (notebook 12).

Place in the flow: `experiments/pd_disaggregation.yaml` is a rate sweep (`rate_sweep_run`)
whose one variable is the router knob `num_prefill` (0: colocated replicas; P >= 1: P prefill
+ the rest decode replicas at the same `num_workers`). Every sweep point logs `requests.csv`
and the router's /metrics delta (`server_delta.json`); every (value, repeat) logs its goodput.
These helpers turn one logged sweep (its parent run id) into frames, and put calc's estimate
beside the measurement; the sweeps and the capacity measurement themselves run through the
runner (`workbench.experiments.studies.pd_disaggregation`):

    SHAPES                             traffic shapes: workload params of balanced-chat
    mean_lengths(shape)                (mean prompt, mean output) tokens of a shape
    layout_name(num_prefill, W)        "colocated x2" | "1P:1D"
    point_runs(parent, uri)            one row per sweep point: layout, repeat, rate, run id,
                                       attainment, validity
    point_requests(parent, uri, rate)  {layout: requests.csv} of every repeat at one rate
    goodput_runs(parent, uri)          one row per (layout, repeat): goodput, per worker
    goodput_table(runs)                per layout: median [min, max] over repeats
    kv_transfer_row(delta)             one /metrics delta -> KV bytes, tokens, reads, time
    kv_moved(parent, uri)              kv_transfer_row per sweep point (and its layout, rate)
    kv_summary(moved)                  per layout: bytes, MB per request, bytes per token
    per_shape(parents, uri, what)      goodput or KV tables of several shapes' experiments

planning.pd_ratio's answers beside these goodputs: `analysis.pd_calc`.

Layouts are named from the variable's value, so frames from several shapes concatenate.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from workbench.analysis.artifacts import run_delta
from workbench.analysis.frames import (
    BASELINE_LABEL,
    PARENT_TAG,
    _client,
    _frame,
    _search,
    run_artifact_frame,
)

SHAPES: dict[str, dict[str, Any]] = {  # balanced-chat params per traffic shape
    "prefill-heavy": {"input_len": {"kind": "uniform", "low": 384, "high": 896},
                      "output_len": {"kind": "uniform", "low": 8, "high": 32},
                      "max_input_len": 896},
    "decode-heavy": {"input_len": {"kind": "uniform", "low": 16, "high": 64},
                     "output_len": {"kind": "uniform", "low": 128, "high": 256},
                     "max_input_len": 128},
    "mixed": {"input_len": {"kind": "uniform", "low": 32, "high": 512},
              "output_len": {"kind": "uniform", "low": 16, "high": 128},
              "max_input_len": 512},
}
KV_COUNTERS = {  # kv_transfer_row field -> the router's aggregate counter
    "recv_bytes": "workbench:kv_transfer_recv_bytes_total",
    "recv_tokens": "workbench:kv_transfer_recv_tokens_total",
    "recv_queries": "workbench:kv_transfer_recv_queries_total",
    "recv_time_s": "workbench:kv_transfer_recv_time_total",
    "failed_recvs": "workbench:kv_transfer_failed_recvs_total",
    "send_bytes": "workbench:kv_transfer_send_bytes_total",
    "expired_sends": "workbench:kv_transfer_expired_sends_total",
    "prefill_fallbacks": "workbench:disagg_prefill_fallbacks_total",
    "prefill_no_params": "workbench:disagg_prefill_no_params_total",
}
_LABELED = re.compile(r"\{.*\}$")


def _check_shape(shape: str) -> dict[str, Any]:
    if shape not in SHAPES:
        raise ValueError(f"shape ({shape!r}) must be one of {', '.join(SHAPES)}")
    return SHAPES[shape]


def mean_lengths(shape: str) -> tuple[float, float]:
    """(mean prompt tokens, mean output tokens) of a shape (uniform: (low + high) / 2)."""
    p = _check_shape(shape)
    return tuple((p[k]["low"] + p[k]["high"]) / 2 for k in ("input_len", "output_len"))


def layout_name(num_prefill: int, num_workers: int) -> str:
    """0 -> "colocated xW"; P -> "PP:MD" with M = W - P (tensor parallelism 1)."""
    if not 0 <= num_prefill < num_workers:
        raise ValueError(f"num_prefill ({num_prefill}) must be in [0, num_workers "
                         f"({num_workers})): 0 is colocated, else P prefill + the rest decode")
    if num_prefill == 0:
        return f"colocated x{num_workers}"
    return f"{num_prefill}P:{num_workers - num_prefill}D"


def _num_prefill(run: pd.Series) -> int:
    value = run.get("params.num_prefill")
    if value is None or value != value:  # NaN: not logged (a template without the knob)
        return 0
    return int(value)


def _children(parent_run_id: str, uri: str | None, role: str) -> pd.DataFrame:
    """Every run under `parent_run_id` (children and their points) with tag role == role."""
    client = _client(uri)
    exp = str(client.get_run(parent_run_id).info.experiment_id)
    runs = _search(client, [exp], f"tags.baseline_run = '{parent_run_id}' and "
                                  f"tags.role = '{role}'")
    return _frame([r for r in runs if PARENT_TAG in r.data.tags])


def _with_layout(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.assign(num_workers=_col(frame, "params.num_workers", 1).fillna(1).astype(int))
    frame["num_prefill"] = [_num_prefill(r) for _, r in frame.iterrows()]
    frame["layout"] = [layout_name(int(p), int(w))
                       for p, w in zip(frame["num_prefill"], frame["num_workers"], strict=True)]
    frame["repeat"] = frame["tags.repeat"].astype(int)
    return frame


def _col(runs: pd.DataFrame, name: str, default: Any = float("nan")) -> pd.Series:
    """Column `name`, or `default` in every row when no run logged it."""
    return runs[name] if name in runs else pd.Series(default, index=runs.index)


def _valid(runs: pd.DataFrame) -> pd.Series:
    """The runs' validity tag (`Store.log_validity`); untagged runs count as valid."""
    return _col(runs, "tags.run_valid", "true").fillna("true").astype(str).str.lower() != "false"


POINT_COLUMNS = ["layout", "value", "num_prefill", "num_workers", "repeat", "rate_index",
                 "rate", "slo_attainment", "completed", "status", "valid", "disturbed",
                 "other_cpu_share", "run_id"]


def point_runs(parent_run_id: str, uri: str | None = None) -> pd.DataFrame:
    """One row per sweep point of the experiment `parent_run_id` (POINT_COLUMNS), in run
    order. A failed point has status FAILED and no attainment (the sweep counted it 0)."""
    runs = _children(parent_run_id, uri, "sweep_point")
    if runs.empty:
        raise ValueError(f"run {parent_run_id} has no sweep points: give the parent run of a "
                         "rate-sweep experiment (ExperimentResult.parent_run_id)")
    runs = _with_layout(runs)
    other = _col(runs, "metrics.other_cpu_share")
    limit = pd.to_numeric(_col(runs, "tags.max_other_cpu_share"))
    return pd.DataFrame({
        "layout": runs["layout"], "value": runs["tags.value"],
        "num_prefill": runs["num_prefill"], "num_workers": runs["num_workers"],
        "repeat": runs["repeat"], "rate_index": runs["tags.rate_index"].astype(int),
        "rate": runs["tags.rate"].astype(float),
        "slo_attainment": _col(runs, "metrics.slo_attainment"),
        "completed": _col(runs, "metrics.completed"),
        "status": runs["status"], "valid": _valid(runs), "disturbed": other > limit,
        "other_cpu_share": other, "run_id": runs["run_id"],
    }, columns=POINT_COLUMNS).reset_index(drop=True)


def point_requests(parent_run_id: str, uri: str | None = None, rate: float | None = None,
                   rate_index: int | None = None) -> dict[str, pd.DataFrame]:
    """{layout: the per-request records (requests.csv) of every FINISHED repeat at one rate,
    concatenated with a `repeat` column}; the rate by value or by index in the sweep."""
    if (rate is None) == (rate_index is None):
        raise ValueError("give exactly one of rate (requests/s) or rate_index")
    points = point_runs(parent_run_id, uri)
    chosen = points[(points["rate"] == rate) if rate is not None
                    else (points["rate_index"] == rate_index)]
    chosen = chosen[chosen["status"] == "FINISHED"]
    if chosen.empty:
        raise ValueError(f"no finished sweep point at {'rate ' + format(rate, 'g') if rate is not None else f'rate_index {rate_index}'}; "  # noqa: E501
                         f"swept rates: {sorted(set(points['rate']))}")
    out: dict[str, pd.DataFrame] = {}
    for layout, group in chosen.groupby("layout", sort=False):
        frames = [run_artifact_frame(r.run_id, "requests.csv", uri).assign(repeat=r.repeat)
                  for r in group.itertuples()]
        out[str(layout)] = pd.concat(frames, ignore_index=True)
    return out


GOODPUT_COLUMNS = ["layout", "repeat", "goodput", "goodput_per_worker", "lower_bound",
                   "failed_points", "valid", "status", "run_id"]


def goodput_runs(parent_run_id: str, uri: str | None = None) -> pd.DataFrame:
    """One row per (layout, repeat): the goodput (req/s) its sweep logged, per worker,
    whether it is a lower bound (every rate met the target), failed points, validity."""
    runs = _children(parent_run_id, uri, "baseline")
    runs = pd.concat([runs, _children(parent_run_id, uri, "variant")], ignore_index=True)
    runs = runs[_col(runs, "tags.kind", "") == "rate_sweep"]
    if runs.empty:
        raise ValueError(f"run {parent_run_id} has no rate-sweep child runs")
    runs = _with_layout(runs)
    frame = pd.DataFrame({
        "layout": runs["layout"], "repeat": runs["repeat"],
        "goodput": _col(runs, "metrics.goodput"),
        "goodput_per_worker": _col(runs, "metrics.goodput_per_worker"),
        "lower_bound": _col(runs, "metrics.goodput_lower_bound", 0.0).fillna(0) > 0,
        "failed_points": _col(runs, "metrics.failed_points", 0.0),
        "valid": _valid(runs), "status": runs["status"],
        "run_id": runs["run_id"]}, columns=GOODPUT_COLUMNS)
    return frame.sort_values(["repeat"], kind="stable").reset_index(drop=True)


def _band(values: Sequence[float]) -> tuple[float, float, float]:
    vals = [float(v) for v in values if v == v]
    if not vals:
        return (float("nan"),) * 3
    return statistics.median(vals), min(vals), max(vals)


def goodput_table(runs: pd.DataFrame, *, valid_only: bool = False) -> pd.DataFrame:
    """Per layout (in first-seen order): repeats, goodput and goodput per worker as median
    with [min, max] over repeats (the noise band), `lower_bound` when any repeat's goodput
    is one, and the repeats counted (all, or only the valid ones with valid_only)."""
    if runs.empty:
        raise ValueError("runs is empty: give goodput_runs(...)")
    rows = []
    for layout, group in runs.groupby("layout", sort=False):
        used = group[group["valid"]] if valid_only else group
        g, g_lo, g_hi = _band(used["goodput"])
        w, w_lo, w_hi = _band(used["goodput_per_worker"])
        rows.append({"layout": layout, "repeats": len(used),
                     "invalid_repeats": int((~group["valid"]).sum()),
                     "goodput": g, "goodput_min": g_lo, "goodput_max": g_hi,
                     "goodput_per_worker": w, "per_worker_min": w_lo, "per_worker_max": w_hi,
                     "lower_bound": bool(used["lower_bound"].any())})
    return pd.DataFrame(rows)


def _aggregate(delta: Mapping[str, Any], name: str) -> float:
    """The unlabelled series `name` of a /metrics delta, else the sum of its labelled ones
    (0.0 when absent)."""
    v = delta.get(name)
    if isinstance(v, int | float):
        return float(v)
    return float(sum(val for key, val in delta.items()
                     if isinstance(val, int | float) and key.startswith(name + "{")
                     and _LABELED.search(key)))


def kv_transfer_row(delta: Mapping[str, Any]) -> dict[str, float]:
    """The KV handoff in one run's /metrics delta (KV_COUNTERS, the router's aggregates)
    and per request: mb_per_request and ms_per_request (decode-side reads),
    bytes_per_token (bytes / tokens read). Colocated runs read nothing: zeros, NaN ratios."""
    row = {field: _aggregate(delta, name) for field, name in KV_COUNTERS.items()}
    reads = row["recv_queries"]
    row["mb_per_request"] = row["recv_bytes"] / reads / 1e6 if reads else float("nan")
    row["ms_per_request"] = row["recv_time_s"] / reads * 1e3 if reads else float("nan")
    row["bytes_per_token"] = (row["recv_bytes"] / row["recv_tokens"] if row["recv_tokens"]
                              else float("nan"))
    return row


def kv_moved(parent_run_id: str, uri: str | None = None) -> pd.DataFrame:
    """kv_transfer_row of every FINISHED sweep point, with its layout, repeat and rate."""
    points = point_runs(parent_run_id, uri)
    points = points[points["status"] == "FINISHED"]
    rows = [{"layout": p.layout, "repeat": p.repeat, "rate": p.rate,
             "completed": p.completed, **kv_transfer_row(run_delta(p.run_id, uri))}
            for p in points.itertuples()]
    return pd.DataFrame(rows)


def kv_summary(moved: pd.DataFrame) -> pd.DataFrame:
    """Per layout over its points: requests, reads, MB read (decode side) and sent (prefill
    side), MB and ms per read, bytes per token, failed reads and prefill fallbacks."""
    if moved.empty:
        raise ValueError("moved is empty: give kv_moved(...)")
    rows = []
    for layout, g in moved.groupby("layout", sort=False):
        reads, recv, tokens = g["recv_queries"].sum(), g["recv_bytes"].sum(), \
            g["recv_tokens"].sum()
        rows.append({"layout": layout, "points": len(g), "requests": int(g["completed"].sum()),
                     "kv_reads": int(reads), "mb_read": recv / 1e6,
                     "mb_sent": g["send_bytes"].sum() / 1e6,
                     "mb_per_read": recv / reads / 1e6 if reads else float("nan"),
                     "ms_per_read": g["recv_time_s"].sum() / reads * 1e3 if reads
                     else float("nan"),
                     "bytes_per_token": recv / tokens if tokens else float("nan"),
                     "failed_reads": int(g["failed_recvs"].sum()),
                     "prefill_fallbacks": int(g["prefill_fallbacks"].sum())})
    return pd.DataFrame(rows)


__all__ = ["BASELINE_LABEL", "KV_COUNTERS", "SHAPES", "goodput_runs", "goodput_table",
           "kv_moved", "kv_summary", "kv_transfer_row", "layout_name", "mean_lengths",
           "per_shape", "point_requests", "point_runs", "run_delta"]


def per_shape(parents: Mapping[str, str], uri: str | None, what: str) -> pd.DataFrame:
    """`goodput_table` ("goodput") or `kv_summary` ("kv") of each shape's experiment
    ({shape: parent run id}), concatenated with a `shape` column first."""
    build = {"goodput": lambda p: goodput_table(goodput_runs(p, uri)),
             "kv": lambda p: kv_summary(kv_moved(p, uri))}
    if what not in build:
        raise ValueError(f"what ({what!r}) must be one of {', '.join(build)}")
    frames = [build[what](parent).assign(shape=shape) for shape, parent in parents.items()]
    out = pd.concat(frames, ignore_index=True)
    return out[["shape", *[c for c in out.columns if c != "shape"]]]


