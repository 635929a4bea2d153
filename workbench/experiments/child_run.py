"""One measured child run of an experiment: a fresh target, the replay, its metrics, validity
and artifacts in MLflow.

    ctx = RunContext(template, store, parent, model, workload, preflight, checksum, ...)
    run_one(ctx, label, value, repeat, arrival, slo)            -> RunRecord

`RunContext` is what every run of one experiment shares (the template, the MLflow store and
parent run, the replayed workload and its checksum, the disturbance threshold, the CPU
watch, ...); the per-run arguments say which value, which repeat and which traffic. The
runner's stages (`execute`) build one context per experiment; a rate sweep
(`rate_sweep_run`) reuses it with its sweep child as `parent`; a cluster node
(`run_jobs.run_on_node`) builds its own from its preflight; `workbench rerun` builds one
under the rerun's run. A failure is recorded on the run (FAILED, error.txt), never raised;
Ctrl-C or SIGTERM ends the run KILLED (`interrupts`).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.experiments import interrupts
from workbench.experiments.run_record import RunRecord, run_label, run_name
from workbench.experiments.template import Template
from workbench.harness import replay as harness  # harness.run: a test may stand in for it
from workbench.harness.cache_metrics import kv_cache_metrics
from workbench.harness.join import log_server_side
from workbench.harness.metrics import records_frame, summary_table
from workbench.harness.server_process import make_target
from workbench.harness.validity import disturbed_line
from workbench.profiling import torch_trace
from workbench.tracking.param_keys import run_params

TRACE_NAME = "torch_trace.json.gz"  # gzip Chrome trace: Perfetto / chrome://tracing open it
SERIES = ["running", "waiting", "kv_cache_usage_perc", "prefill_tokens", "decode_tokens"]


@dataclass(frozen=True)
class RunContext:
    """What every measured run of one experiment shares."""

    template: Template
    store: Any  # `tracking.mlflow_store.Store`
    parent: str  # the run the child is logged under (the experiment's, a sweep child's)
    model: str  # the local folder whose tokenizer built the workload
    workload: Any  # `harness.workloads.Workload`, replayed by every run
    preflight: dict[str, Any]  # this node's `workbench preflight` (fingerprint, hostname)
    checksum: str  # the workload every run must replay
    profile: str | None = None  # "torch": a Chrome trace per run
    max_other_cpu_share: float | None = None  # the disturbance threshold (`validity`)
    cpu_watch: Any = None  # `validity.CpuWatch` (None: the harness's default)
    progress: bool = False  # a bar of requests within each run
    out: Path | None = None  # the results folder (traces/ go there), None: none


def run_one(ctx: RunContext, label: str, value: Any, repeat: int, arrival: Any, slo: Any, *,
            name: str | None = None, tags: dict[str, str] | None = None,
            arrivals: dict[str, Any] | None = None,
            extra_metrics: Callable[[Any], dict[str, float]] | None = None) -> RunRecord:
    """One measured child run of `ctx.parent` (baseline: value None) with `arrival` traffic
    and judged against `slo`; a failure is recorded, never raised. `tags` are added to (and
    override) the child's tags (`workbench rerun`: role=rerun). A rate sweep's point
    (`rate_sweep_run`) names the run (`name`), logs the arrivals it ran (`arrivals`, default
    the template's) and adds `extra_metrics(result)` to its metrics (its SLO attainment)."""
    t, store = ctx.template, ctx.store
    config = t.baseline if value is None else t.variant_config(value)
    host = str(ctx.preflight.get("hostname"))
    all_tags = {"variable": t.variable_name, "value": label, "repeat": str(repeat),
                "baseline_run": ctx.parent, "role": "baseline" if value is None else "variant",
                "workload_checksum": ctx.checksum,
                "hardware_fingerprint": ctx.preflight["fingerprint"],
                "node": host, "node_hostname": host, **(tags or {})}
    run_id = store.create_run(  # "k=5 r2": unique in the runs table
        name or run_name(t, value, repeat, all_tags.get("retry")), parent_id=ctx.parent,
        tags=all_tags)
    store.log_params(run_id, run_params(  # knob keys as on every path (param_keys)
        config, t.workload, t.arrivals if arrivals is None else arrivals,
        cache_state=t.cache_state, target=t.target, model=ctx.model, repeat=repeat,
        built=ctx.workload))
    record = RunRecord(label, value, repeat, run_id, node=all_tags["node"],
                       fingerprint=str(ctx.preflight["fingerprint"]))
    result = target = None
    killed: str | None = None  # why it was interrupted
    try:
        if ctx.workload.checksum != ctx.checksum:
            raise RuntimeError("the workload changed between runs (checksum mismatch)")
        result, target = _replay(ctx, config, arrival, run_id, f"{label}_r{repeat}", repeat)
        if result.error:
            raise RuntimeError(result.error)
        _record_result(ctx, record, result, slo, extra_metrics)
        if record.disturbed:
            v = result.validity
            print(disturbed_line(f"run {run_label(t, value)} repeat {repeat + 1}/{t.repeats}",
                                 v.other_cpu_share, v.max_other_cpu_share), flush=True)
    except Exception as e:  # one failed run must not lose the others
        record.error = f"{type(e).__name__}: {e}"
        store.log_files(run_id, {"error.txt": traceback.format_exc()})
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: KILLED, measured again on --resume
        record.error = killed = interrupts.killed_reason(e)
        raise
    finally:
        if result is not None:
            _log_run_artifacts(store, run_id, result, record.metrics, target)
        if killed is not None:
            store.kill(run_id, killed)
        else:
            store.finish(run_id, failed=record.error is not None)
    return record


def _replay(ctx: RunContext, config: dict[str, Any], arrival: Any, run_id: str,
            stem: str, repeat: int = 0) -> tuple[Any, Any]:
    """(RunResult, target): the workload replayed on a fresh target. In-process: a fresh
    engine; http: the server command (engine knobs as flags) started before the run and
    stopped after it. `ctx.profile == "torch"`: the run's trace kept (`_keep_trace`)."""
    t = ctx.template
    if t.target.get("kind") == "simulated":  # the real scheduler on a virtual clock
        from workbench.sim.target import run_simulated

        return run_simulated(t.target, config, ctx.workload, arrival, t.cache_state,
                             repeat), None
    target, lifecycle = make_target(t.target, config)
    with lifecycle, tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / TRACE_NAME
        try:
            with torch_trace(str(trace)) if ctx.profile == "torch" else contextlib.nullcontext():
                result = harness.run(target, ctx.workload, arrival, cache_state=t.cache_state,
                             warmup_requests=t.warmup_requests,
                             max_other_cpu_share=ctx.max_other_cpu_share,
                             cpu_watch=ctx.cpu_watch, progress=ctx.progress,
                             warn_invalid=False)
        finally:
            harness.run_sync(target.stop)  # the target before its server
        if trace.exists():
            _keep_trace(ctx.store, run_id, trace, ctx.out, stem, ctx.progress)
    return result, target


def _record_result(ctx: RunContext, record: RunRecord, result: Any, slo: Any,
                   extra_metrics: Callable[[Any], dict[str, float]] | None) -> None:
    """The run's metrics (and `extra_metrics`), KV-cache counters and validity: on `record`
    and logged."""
    record.metrics = result.metrics(slo=slo)
    if extra_metrics is not None:
        record.metrics.update(extra_metrics(result))
    engine_time = (phase_shares(result.step_trace)["engine_time_s"]
                   if result.step_trace else None)
    record.metrics.update(kv_cache_metrics(result.server_delta, engine_time))
    v = result.validity
    record.valid, record.disturbed = v.valid, v.disturbed
    record.other_cpu_share = v.other_cpu_share
    ctx.store.log_metrics(record.run_id, record.metrics)
    ctx.store.log_validity(record.run_id, v.valid, v.reasons, v.other_cpu_share,
                           v.max_other_cpu_share)
    ctx.store.set_tags(record.run_id, {"open_loop": str(result.open_loop)})


def _log_run_artifacts(
    store: Any, run_id: str, result: Any, metrics: dict[str, float], target: Any = None
) -> None:
    files: dict[str, str | bytes] = {
        "requests.csv": records_frame(result.records).to_csv(index=False),
        "summary.json": json.dumps({"metrics": metrics, "validity": vars(result.validity),
                                    "arrival": result.arrival, "cache_state": result.cache_state,
                                    "target": result.target}, indent=2, default=str),
    }
    if metrics:
        files["summary.md"] = summary_table(metrics)
    if result.step_trace:
        files["step_trace.csv"] = pd.DataFrame(result.step_trace).to_csv(index=False)
        store.log_series(run_id, result.step_trace, SERIES)
        store.log_metrics(run_id, phase_shares(result.step_trace))
    if (result.target or {}).get("kind") == "http":
        log_server_side(store, run_id, result, target)
    store.log_files(run_id, files)


def phase_shares(step_trace: list[dict[str, Any]]) -> dict[str, float]:
    """Share of engine time in steps that carried prefill tokens vs pure-decode steps."""
    total = sum(r["duration_s"] for r in step_trace) or 1.0
    prefill = sum(r["duration_s"] for r in step_trace if r.get("prefill_tokens", 0) > 0)
    return {"engine_time_s": total, "prefill_step_share": prefill / total,
            "decode_only_step_share": 1.0 - prefill / total}


def _keep_trace(store: Any, run_id: str, trace: Path, out: Path | None, stem: str,
                say: bool) -> None:
    """Log the trace as the run's artifact; copy it to <out>/traces/<stem>.json.gz; say where."""
    store.log_artifact(run_id, trace)
    where = [f"MLflow run {run_id} artifact {trace.name}"]
    if out is not None:
        local = out / "traces" / f"{re.sub(r'[^A-Za-z0-9._=-]+', '_', stem)}.json.gz"
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace, local)
        where.append(str(local))
    if say:
        print(f"torch trace ({trace.stat().st_size / 1e6:.1f} MB gzip; open in "
              f"https://ui.perfetto.dev): {' and '.join(where)}", flush=True)
