"""Layouts behind `workbench router` as experiments (notebooks 09 and 10): a layout beside one
worker, both layouts at concurrency 1, and one replica beside N.

Place in the flow: a notebook scales a router template down (`analysis.notebook.
override_template`) and points its target at this interpreter (`targets.local_target`); these
derive the other experiments its question needs from that raw template, run each through the
runner (`measure`) and read the runs back (`analysis.replicas`):

    one_worker(raw, uri)              the template's traffic on one worker against its
                                      `num_workers` replicas: experiment "<name>-one-worker"
                                      (baseline num_workers 1, variable num_workers)
    layout_table(result, reference, template, uri)
                                      rows: one worker (the reference's baseline runs), then
                                      every run of the layout experiment `result`, with the
                                      replicas its router reported; per-request frames by
                                      layout; one worker's output throughput
    latency_pair(raw, num_requests, seed, uri)
                                      both layouts at concurrency 1 on `num_requests` other
                                      requests: experiment "<name>-latency"
    scaling(raw, num_replicas, uri, ...)
                                      1 replica vs `num_replicas` on closed-loop chat:
                                      experiment "<name>-scaling" (variable num_replicas);
                                      `analysis.replicas.scaling_row` reads it

Scaling efficiency = throughput_N / (N x throughput_1) (`planning.scaling_efficiency`).
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping
from typing import Any

import pandas as pd

from workbench.analysis.notebook import override_template
from workbench.analysis.replicas import layout_names, layout_row, run_replica_summary
from workbench.experiments.runner import ExperimentResult
from workbench.experiments.studies.measure import finished_runs, measure

CHAT_LENGTHS = {"input_len": {"kind": "fixed", "value": 64},
                "output_len": {"kind": "fixed", "value": 32}}


def one_worker_template(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The raw layout template asked of one worker: same traffic, target and engine, the
    baseline on num_workers 1 (TP=1), the variable num_workers at the template's count."""
    out = copy.deepcopy(dict(raw))
    workers = int(out["baseline"]["num_workers"])
    out["name"] = f"{raw['name']}-one-worker"
    out["question"] = (f"On the same traffic, how much more does {workers} workers as "
                       f"{workers} replicas (TP=1) serve than one worker? (the reference of "
                       f"{raw['name']}'s scaling efficiency)")
    out["baseline"] = {**out["baseline"], "num_workers": 1, "tensor_parallel_size": 1}
    out["variable"] = {"name": "num_workers", "values": [workers]}
    out.pop("quality_gate", None)
    return out


def one_worker(raw: Mapping[str, Any], uri: str, progress: bool = True) -> ExperimentResult:
    """Run `one_worker_template(raw)` into `uri`."""
    return measure(one_worker_template(raw), uri, progress=progress)


def layout_table(result: ExperimentResult, reference: ExperimentResult, template: Any,
                 uri: str) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], float]:
    """One worker (each finished baseline run of `reference`, `one_worker`'s result), then one
    `layout_row` per finished run of `result` (a tensor_parallel_size experiment of
    `template`) with the replicas its router reported. Returns the rows, per-request frames
    by layout (the first repeat of each) and one worker's output throughput (the median of
    the reference's). Both must have replayed the same traffic; failed runs are printed and
    left out."""
    from workbench.analysis.frames import run_artifact_frame

    if reference.workload_checksum != result.workload_checksum:
        raise ValueError(f"the one-worker reference replayed other traffic "
                         f"({reference.workload_checksum[:12]}) than {result.name} "
                         f"({result.workload_checksum[:12]})")
    _print_failed(reference)
    _print_failed(result)
    single = finished_runs(reference, baseline=True)
    if not single:
        raise RuntimeError(f"every one-worker run of {reference.name} failed")
    throughput_1 = statistics.median(r.metrics["output_throughput"] for r in single)
    rows = [layout_row("1 worker", r.metrics, r.valid, 1, throughput_1) for r in single]
    requests = {"1 worker": run_artifact_frame(single[0].run_id, "requests.csv", uri)}
    workers = template.baseline["num_workers"]
    names = layout_names(workers)
    for r in [r for r in result.runs if r.error is None]:
        tp = template.baseline["tensor_parallel_size"] if r.value is None else r.value
        replicas_seen = len(run_replica_summary(r.run_id, uri)) - 1  # rows: replicas + "all"
        rows.append({**layout_row(names[tp], r.metrics, r.valid, workers, throughput_1),
                     "repeat": r.repeat, "replicas_seen": replicas_seen})
        if names[tp] not in requests:
            requests[names[tp]] = run_artifact_frame(r.run_id, "requests.csv", uri)
    return pd.DataFrame(rows), requests, float(throughput_1)


def latency_template(raw: Mapping[str, Any], num_requests: int, seed: int) -> dict[str, Any]:
    """The raw layout template at concurrency 1 on `num_requests` requests of workload seed
    `seed`, one run per layout."""
    out = override_template(raw, name=f"{raw['name']}-latency", seed=seed,
                            workload_params={"num_requests": num_requests},
                            arrivals={"mode": "closed", "concurrency": 1}, repeats=1)
    out.pop("quality_gate", None)
    return out


def latency_pair(raw: Mapping[str, Any], num_requests: int, seed: int, uri: str,
                 progress: bool = True) -> pd.DataFrame:
    """Both layouts of the template's `num_workers` (all replicas, one TP replica) at
    concurrency 1 (`latency_template`): one `layout_row` each, without scaling efficiency."""
    result = measure(latency_template(raw, num_requests, seed), uri, progress=progress)
    _print_failed(result)
    workers = raw["baseline"]["num_workers"]
    names = layout_names(workers)
    rows = [layout_row(names[raw["baseline"]["tensor_parallel_size"] if r.value is None
                             else r.value], r.metrics, r.valid, workers)
            for r in result.runs if r.error is None]
    return pd.DataFrame(rows).drop(columns=["scaling_efficiency"])


def scaling_template(raw: Mapping[str, Any], num_replicas: int, num_requests: int,
                     concurrency: int, seed: int) -> dict[str, Any]:
    """The raw router template asked: does `num_replicas` replicas serve more than one?
    Closed-loop balanced-chat traffic (64 prompt / 32 output tokens), `concurrency` clients,
    one run each; the baseline engine and policy as the template has them."""
    if num_replicas < 2:
        raise ValueError(f"num_replicas ({num_replicas}) must be >= 2 to compare with 1")
    out = override_template(raw, name=f"{raw['name']}-scaling", repeats=1,
                            arrivals={"mode": "closed", "concurrency": concurrency})
    out["question"] = (f"On closed-loop chat traffic ({concurrency} clients), how much more "
                       f"output throughput do {num_replicas} replicas serve than one? "
                       "(scaling efficiency = throughput_N / (N x throughput_1))")
    out["objective"] = {"metric": "output_throughput", "direction": "maximize"}
    out["workload"] = {"fixture": "balanced-chat", "seed": seed,
                       "params": {"num_requests": num_requests, **copy.deepcopy(CHAT_LENGTHS)}}
    out["baseline"] = {**out["baseline"], "num_replicas": 1}
    out["variable"] = {"name": "num_replicas", "values": [num_replicas]}
    out.pop("quality_gate", None)
    return out


def scaling(raw: Mapping[str, Any], num_replicas: int, uri: str, *, num_requests: int,
            concurrency: int, seed: int, progress: bool = True) -> ExperimentResult:
    """Run `scaling_template(...)` into `uri`."""
    return measure(scaling_template(raw, num_replicas, num_requests, concurrency, seed), uri,
                   progress=progress)


def _print_failed(result: ExperimentResult) -> None:
    for r in result.runs:
        if r.error:
            print(f"{result.name}: {r.label} repeat {r.repeat} failed: {r.error}")
