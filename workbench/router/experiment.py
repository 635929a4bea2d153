"""The router as a bench target: templates that start it, and what a run through it recorded.

Place in the flow: an experiment template names `command: [workbench, router, ...]`; the
runner appends the engine config as flags (`policy: prefix_aware` is the router's, the rest
reach every replica) and measures the router like any OpenAI server. These helpers serve the
notebook and scripts:

    local_target(spec, port=, num_replicas=, model=) the template's target run with this
                                                     interpreter (`python -m workbench.cli`),
                                                     on another port / replica count / model
    run_replica_summary(run_id, uri)                 per-replica + aggregate rows of one
                                                     logged run (its server_delta.json)
    scaling(spec, config, workload, arrival, n)      output throughput with 1 and n replicas
                                                     and the scaling efficiency
    run_layout(spec, config, wl, arrival, w, tp)     one run on w worker processes as w / tp
                                                     replicas of tensor_parallel_size tp
    layout_row(name, metrics, valid, w, tput_1)      a run's throughput, TTFT/TPOT tails and
                                                     scaling efficiency against one worker
    layout_names(w)                                  {tp: "w replicas (TP=1)" | "1 replica, TP=w"}
    layout_table(result, template, wl, arrival, uri) one worker, then every logged layout run:
                                                     rows, per-request frames, throughput_1
    latency_pair(template, wl, arrival)              both layouts on one more workload
    policy_tables(result, baseline_policy, uri)      per run and per replica: TTFT, hit rate
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.calc import scaling_efficiency
from workbench.router.summary import replica_summary


def _set_flag(command: list[str], flag: str, value: str) -> list[str]:
    if flag in command:
        i = command.index(flag)
        return [*command[: i + 1], value, *command[i + 2:]]
    return [*command, flag, value]


def local_target(spec: dict[str, Any], port: int | None = None,
                 num_replicas: int | None = None, model: str | None = None) -> dict[str, Any]:
    """A copy of a router target spec whose command runs `sys.executable -m workbench.cli`
    (no `workbench` script needed on PATH), with `port`, `num_replicas` and `model` (a named
    model or folder, served under that name) set when given."""
    out = copy.deepcopy(spec)
    command = [str(c) for c in out["command"]]
    if command and Path(command[0]).name == "workbench":
        command = [sys.executable, "-m", "workbench.cli", *command[1:]]
    if port is not None:
        command = _set_flag(command, "--port", str(port))
        out["base_url"] = f"http://127.0.0.1:{port}/v1"
    if num_replicas is not None:
        command = _set_flag(command, "--num-replicas", str(num_replicas))
    if model is not None:
        command = _set_flag(_set_flag(command, "--model", model), "--served-model-name", model)
        out["model"] = out["tokenizer"] = model
    out["command"] = command
    return out


def run_replica_summary(run_id: str, uri: str) -> list[dict[str, Any]]:
    """`replica_summary` of the /metrics delta an HTTP run logged (server_delta.json)."""
    from mlflow.tracking import MlflowClient

    from workbench.analysis.frames import no_progress_bar

    client = MlflowClient(tracking_uri=uri)
    with tempfile.TemporaryDirectory() as tmp, no_progress_bar():
        path = client.download_artifacts(run_id, "server_delta.json", tmp)
        delta = json.loads(Path(path).read_text())["delta"]
    return replica_summary(delta)


LAYOUT_METRICS = ("output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
                  "median_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "completed")


def _measured(spec: dict[str, Any], config: dict[str, Any], workload: Any, arrival: Any,
              what: str, **run_kw: Any) -> Any:
    from workbench.harness.server_process import run_variant

    result, _ = run_variant(spec, config, workload, arrival, **run_kw)
    if result.error:
        raise RuntimeError(f"the {what} run failed: {result.error}")
    return result


def run_layout(spec: dict[str, Any], config: dict[str, Any], workload: Any, arrival: Any,
               num_workers: int, tensor_parallel_size: int, **run_kw: Any) -> Any:
    """One measured run (RunResult) of the router target on `num_workers` worker processes
    arranged as num_workers / tensor_parallel_size replicas of `tensor_parallel_size` ranks
    (the `num_workers` router knob); the rest of `config` is every replica's engine."""
    cfg = {k: v for k, v in config.items() if k != "num_replicas"}
    cfg.update(num_workers=num_workers, tensor_parallel_size=tensor_parallel_size)
    return _measured(local_target(spec), cfg, workload, arrival,
                     f"{num_workers}-worker tensor_parallel_size={tensor_parallel_size}",
                     **run_kw)


def layout_row(layout: str, metrics: Mapping[str, float], valid: bool, num_workers: int,
               throughput_1: float | None = None) -> dict[str, Any]:
    """A table row: LAYOUT_METRICS of one run's metrics (`RunResult.metrics()`, or a logged
    experiment run's), its validity, and scaling_efficiency against `throughput_1` (one
    worker's output throughput on the same traffic; NaN when not given)."""
    missing = [k for k in LAYOUT_METRICS if k not in metrics]
    if missing:
        raise ValueError(f"metrics lack {', '.join(missing)}; measure percentiles 50, 95, 99")
    row: dict[str, Any] = {"layout": layout, "num_workers": num_workers}
    row.update({k: float(metrics[k]) for k in LAYOUT_METRICS})
    row["valid"] = bool(valid)
    row["scaling_efficiency"] = (
        scaling_efficiency(row["output_throughput"], throughput_1, num_workers)
        if throughput_1 else float("nan"))
    return row


def scaling(spec: dict[str, Any], config: dict[str, Any], workload: Any, arrival: Any,
            num_replicas: int, **run_kw: Any) -> dict[str, Any]:
    """One run with 1 replica and one with `num_replicas` (same router target, workload and
    arrivals): output throughputs and scaling_efficiency(throughput_n, throughput_1, n)."""
    if num_replicas < 2:
        raise ValueError(f"num_replicas ({num_replicas}) must be >= 2 to compare with 1")
    out: dict[str, Any] = {"num_replicas": num_replicas}
    for n, key in ((1, "throughput_1"), (num_replicas, "throughput_n")):
        result = _measured(local_target(spec, num_replicas=n), config, workload, arrival,
                           f"{n}-replica", **run_kw)
        metrics = result.metrics()
        out[key] = metrics["output_throughput"]
        out[f"p95_ttft_ms_{n}"] = metrics["p95_ttft_ms"]
        out[f"valid_{n}"] = result.validity.valid
    out["scaling_efficiency"] = scaling_efficiency(out["throughput_n"], out["throughput_1"],
                                                   num_replicas)
    return out


def layout_names(num_workers: int) -> dict[int, str]:
    """The layouts of `num_workers` workers by tensor_parallel_size: all replicas (TP=1) or
    one replica of every worker (TP=num_workers)."""
    return {1: f"{num_workers} replicas (TP=1)", num_workers: f"1 replica, TP={num_workers}"}


def layout_table(result: Any, template: Any, workload: Any, arrival: Any, uri: str
                 ) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], float]:
    """The experiment's traffic on one worker (TP=1), then one `layout_row` per logged run of
    `result` (an ExperimentResult of a tensor_parallel_size experiment), with the replicas
    its router reported. Returns the rows, per-request frames by layout (the first repeat of
    each) and one worker's output throughput. Failed runs are printed and left out."""
    from workbench.analysis.frames import run_artifact_frame
    from workbench.harness.metrics import records_frame

    workers = template.baseline["num_workers"]
    names = layout_names(workers)
    single = run_layout(template.target, template.baseline, workload, arrival, 1, 1,
                        cache_state=template.cache_state,
                        warmup_requests=template.warmup_requests)
    throughput_1 = float(single.metrics()["output_throughput"])
    rows = [layout_row("1 worker", single.metrics(), single.validity.valid, 1, throughput_1)]
    requests = {"1 worker": records_frame(single.records)}
    for r in result.runs:
        if r.error:
            print(f"{r.label} repeat {r.repeat} failed: {r.error}")
            continue
        tp = template.baseline["tensor_parallel_size"] if r.value is None else r.value
        replicas_seen = len(run_replica_summary(r.run_id, uri)) - 1  # rows: replicas + "all"
        rows.append({**layout_row(names[tp], r.metrics, r.valid, workers, throughput_1),
                     "repeat": r.repeat, "replicas_seen": replicas_seen})
        if names[tp] not in requests:
            requests[names[tp]] = run_artifact_frame(r.run_id, "requests.csv", uri)
    return pd.DataFrame(rows), requests, throughput_1


def latency_pair(template: Any, workload: Any, arrival: Any) -> pd.DataFrame:
    """Both layouts of the template's `num_workers` (all replicas, one TP replica) on
    `workload`: one `layout_row` each, without scaling efficiency."""
    workers = template.baseline["num_workers"]
    rows = []
    for tp, name in layout_names(workers).items():
        res = run_layout(template.target, template.baseline, workload, arrival, workers, tp,
                         cache_state=template.cache_state,
                         warmup_requests=template.warmup_requests)
        rows.append(layout_row(name, res.metrics(), res.validity.valid, workers))
    return pd.DataFrame(rows).drop(columns=["scaling_efficiency"])


def policy_tables(result: Any, baseline_policy: str, uri: str
                  ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame]]:
    """Per logged run of a routing-policy experiment: client TTFT and throughput with the
    aggregate prefix-cache hit rate and server TTFT its replicas reported; per replica, the
    `replica_summary` rows; and each run's per-request frame keyed "<policy>, repeat <i>".
    Failed runs are printed and left out."""
    from workbench.analysis.frames import run_artifact_frame

    rows, replica_rows, requests = [], [], {}
    for r in result.runs:
        if r.error:
            print(f"{r.label} repeat {r.repeat} failed: {r.error}")
            continue
        policy = baseline_policy if r.value is None else r.value
        summary = run_replica_summary(r.run_id, uri)
        total = summary[-1]
        rows.append({"policy": policy, "repeat": r.repeat,
                     **{k: r.metrics[k] for k in ("median_ttft_ms", "p95_ttft_ms",
                                                  "output_throughput")},
                     "prefix_hit_rate": total["prefix_hit_rate"],
                     "server_mean_ttft_ms": total["mean_ttft_ms"], "valid": r.valid})
        replica_rows += [{"policy": policy, "repeat": r.repeat, **row} for row in summary]
        requests[f"{policy}, repeat {r.repeat}"] = run_artifact_frame(r.run_id, "requests.csv",
                                                                      uri)
    return pd.DataFrame(rows), pd.DataFrame(replica_rows), requests
