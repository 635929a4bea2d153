"""Client and server timings side by side: what the HTTP path and the queue add.

Place in the flow: after a run, `join_client_server` puts each request's client TTFT/E2E
(`RequestRecord`) beside the server's own numbers for the same request id (from the final
chunk of `workbench serve`, or the in-process engine's timestamps), so HTTP + client overhead
= client TTFT - server TTFT is visible per request. `overhead_table` compares one workload
run in-process and over HTTP. `server_side` / `log_server_side` gather what an HTTP run adds
to its MLflow child run: /metrics deltas (histogram means), the Δcount check, the Poller
series (running / waiting / KV usage every second) and the join as CSV.

A real vLLM streams no per-request server timings: its join has client columns only, and
the server side is the histogram means of `prom.delta`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from workbench.harness import prom
from workbench.harness.metrics import RequestRecord

_SERVER_KEYS = ("server_queue_s", "server_prefill_s", "server_decode_s", "server_ttft_s",
                "server_e2e_s")
SERIES_KEYS = ["running", "waiting", "kv_cache_usage_perc"]


def _ms(v: Any) -> float:
    return float(v) * 1000.0 if isinstance(v, int | float) else float("nan")


def join_client_server(
    records: Sequence[RequestRecord], server_rows: Sequence[dict[str, Any]] | None = None
) -> pd.DataFrame:
    """One row per client record, joined on request id with `server_rows` (dicts with
    "request_id" and any of server_queue_s / prefill / decode / ttft / e2e, seconds); without
    `server_rows`, the records' own server_* fields. Times in ms; overhead = client - server.
    `frame.attrs["unmatched_server_rows"]` counts server rows with no client record."""
    if server_rows is None:
        server = {r.request_id: {k: getattr(r, k) for k in _SERVER_KEYS} for r in records}
    else:
        server = {str(row["request_id"]): dict(row) for row in server_rows}
    ids = {r.request_id for r in records}
    rows = []
    for r in records:
        s = server.get(r.request_id)
        got = s or {}
        times = {"client_ttft_ms": _ms(r.ttft_s), "client_e2e_ms": _ms(r.e2e_s),
                 **{k.removesuffix("_s") + "_ms": _ms(got.get(k)) for k in _SERVER_KEYS}}
        row: dict[str, object] = {
            "request_id": r.request_id, "success": r.success, "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens, "matched": s is not None, **times,
            "ttft_overhead_ms": times["client_ttft_ms"] - times["server_ttft_ms"],
            "e2e_overhead_ms": times["client_e2e_ms"] - times["server_e2e_ms"],
        }
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.attrs["unmatched_server_rows"] = sum(1 for k in server if k not in ids)
    return frame


def _records(result: Any) -> list[RequestRecord]:
    return list(result.records if hasattr(result, "records") else result)


def _summary(records: list[RequestRecord]) -> dict[str, float]:
    ok = [r for r in records if r.success]
    frame = join_client_server(ok)
    itls = [g * 1000.0 for r in ok for g in r.itls_s]
    out: dict[str, float] = {"requests": float(len(ok))}
    cols = {"client_ttft": frame.get("client_ttft_ms"), "server_ttft": frame.get("server_ttft_ms"),
            "ttft_overhead": frame.get("ttft_overhead_ms"), "e2el": frame.get("client_e2e_ms"),
            "itl": pd.Series(itls, dtype="float64")}
    for name, col in cols.items():
        vals = col.dropna().to_numpy() if col is not None else np.array([])
        out[f"median_{name}_ms"] = float(np.median(vals)) if len(vals) else float("nan")
        out[f"p95_{name}_ms"] = float(np.percentile(vals, 95)) if len(vals) else float("nan")
    return out


def overhead_table(inproc_result: Any, http_result: Any) -> pd.DataFrame:
    """The same workload in-process vs over HTTP: successful requests, median and p95 of
    client TTFT, server TTFT, their difference, E2EL and ITL (ms); a third row is
    http - in-process. Takes RunResults or lists of RequestRecords."""
    a, b = _summary(_records(inproc_result)), _summary(_records(http_result))
    diff = {k: b[k] - a[k] for k in a}
    return pd.DataFrame([a, b, diff], index=["in-process", "http", "http - in-process"])


# --------------------------------------------------------------------------- MLflow
def server_side(result: Any, target: Any = None) -> dict[str, Any]:
    """What an HTTP run adds beside the client metrics: {"delta" (prom.delta), "metrics"
    (MLflow-safe, "server." prefix), "count_check" (None or why Δcount is off), "series"
    (Poller rows of the measured run), "files" (artifact name -> text)}."""
    d = prom.delta(result.server_before or {}, result.server_after or {})
    check = prom.check_request_count(d, len(result.records)) if d else "no /metrics deltas"
    series = target.server_series() if hasattr(target, "server_series") else []
    rows = target.server_rows() if hasattr(target, "server_rows") else None
    files: dict[str, str] = {
        "server_delta.json": json.dumps({"delta": d, "count_check": check}, indent=2),
        "client_server_join.csv": join_client_server(result.records, rows).to_csv(index=False),
    }
    if series:
        files["server_series.csv"] = pd.DataFrame(series).to_csv(index=False)
    return {"delta": d, "metrics": prom.mlflow_safe(d), "count_check": check,
            "series": series, "files": files}


def log_server_side(store: Any, run_id: str, result: Any, target: Any = None) -> dict[str, Any]:
    """`server_side` written to one MLflow run through workbench.tracking.mlflow_store.Store:
    metrics `server.vllm/...`, series `server.running` / `server.waiting` /
    `server.kv_cache_usage_perc` per poll, artifacts, tag `server_count_check`."""
    side = server_side(result, target)
    store.log_metrics(run_id, side["metrics"])
    if side["series"]:
        store.log_series(run_id, side["series"], SERIES_KEYS, step_key="step", prefix="server.")
    store.log_files(run_id, side["files"])
    store.set_tags(run_id, {"server_count_check": side["count_check"] or "ok"})
    return side
