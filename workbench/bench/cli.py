"""`workbench bench`: replay one workload against one target, print vLLM's result table.

    workbench bench --target http://HOST:PORT/v1 | inprocess --model NAME_OR_DIR
                    --workload FIXTURE | FILE.jsonl | trace:FORMAT:PATH [--num-requests N]
                    [--seed S] [--param KEY=VALUE ...] [--arrivals closed:4 | poisson:8 |
                    gamma:8:0.5 | constant:8 | trace] [--max-concurrency N]
                    [--cache-state warm-model]
                    [--engine KEY=VALUE ...] [--server-cmd "workbench serve ..."]
                    [--endpoint completions|chat] [--prompt-mode auto|token_ids|text]
                    [--tokenizer DIR] [--tracking-uri URI | --no-mlflow] [--json PATH]
                    [--max-other-cpu-share 0.25]

Place in the flow: argument parsing only; the work is `runner.run` on an `InProcessTarget` or
an `OpenAITarget` (built by `server_process.make_target`, which also starts `--server-cmd`
with the `--engine` keys as server flags and stops it afterwards). Prints the summary table
(metrics.summary_table), an open loop's client lateness (validity.lateness_table), then the
server side of an HTTP run (/metrics deltas: histogram means, token counters, the Δcount
check; the Poller's peak running / waiting / KV usage), and logs everything to MLflow (the
local store unless --tracking-uri; --no-mlflow skips it).
A run during which other processes used more than --max-other-cpu-share of the machine's CPUs
is marked INVALID (console, JSON, MLflow tag run_valid=false and metric other_cpu_share).
The workload's prompts are built with the tokenizer of --tokenizer (default: --model when it
is a local folder or "bundled"), so it must match the served model. A trace file
(`trace:FORMAT:PATH`: options as --param, replayed at its recorded times by default):
`bench/trace_workload.py`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from workbench.bench import trace_workload as traces
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, lateness_table


def parse_arrivals(text: str, seed: int = 0, max_concurrency: int | None = None
                   ) -> ArrivalSpec:
    """"closed:4" | "poisson:8" | "gamma:8:0.5" | "constant:8" | "trace" -> ArrivalSpec."""
    mode, *rest = text.split(":")
    try:
        if mode == "closed" and len(rest) == 1:
            return ArrivalSpec(mode="closed", concurrency=int(rest[0]))
        if mode == "trace" and not rest:
            return ArrivalSpec(mode="trace", max_concurrency=max_concurrency)
        if mode in ("poisson", "constant") and len(rest) == 1:
            return ArrivalSpec(mode=mode, rate=float(rest[0]), seed=seed,
                               max_concurrency=max_concurrency)
        if mode == "gamma" and len(rest) == 2:
            return ArrivalSpec(mode="gamma", rate=float(rest[0]), burstiness=float(rest[1]),
                               seed=seed, max_concurrency=max_concurrency)
    except ValueError as e:
        raise SystemExit(f"--arrivals {text!r}: {e}") from e
    raise SystemExit(f"--arrivals {text!r} must be closed:C, poisson:RATE, gamma:RATE:SHAPE, "
                     "constant:RATE or trace")


def _kv(items: list[str], flag: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{flag} {item!r} must be KEY=VALUE")
        out[key.replace("-", "_")] = yaml.safe_load(value)
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="workbench bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="http://HOST:PORT/v1 or 'inprocess'")
    ap.add_argument("--model", required=True,
                    help="served model name (http) or a local folder / 'bundled'")
    ap.add_argument("--workload", required=True, help="fixture name, a JSONL file, or "
                    "trace:FORMAT:PATH (sharegpt, burstgpt, azure, mooncake)")
    ap.add_argument("--tokenizer", default=None, help="local tokenizer folder for the prompts")
    ap.add_argument("--num-requests", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--param", action="append", default=[],
                    help="fixture or trace option KEY=VALUE (YAML)")
    ap.add_argument("--arrivals", default=None, help="closed:C, poisson:RATE, gamma:RATE:SHAPE, "
                    "constant:RATE or trace (default: trace for a trace with times, else "
                    "closed:4)")
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--cache-state", default="warm-model",
                    choices=["cold", "warm-model", "warm-prefix"])
    ap.add_argument("--warmup-requests", type=int, default=2)
    ap.add_argument("--max-duration", type=float, default=None, help="seconds")
    ap.add_argument("--max-other-cpu-share", type=float, default=DEFAULT_MAX_OTHER_CPU_SHARE,
                    help="mark the run invalid when other processes used more than this "
                    "share of the machine's CPUs meanwhile (0..1)")
    ap.add_argument("--engine", action="append", default=[],
                    help="engine KEY=VALUE: in-process kwargs, or server flags with --server-cmd")
    ap.add_argument("--server-cmd", default=None, help="start this server around the run")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    ap.add_argument("--prompt-mode", default="auto", choices=["auto", "token_ids", "text"])
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--no-ignore-eos", action="store_true", help="let EOS end a request")
    ap.add_argument("--poll-interval", type=float, default=1.0, help="/metrics poll, seconds")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--experiment", default="bench", help="MLflow experiment name")
    ap.add_argument("--no-mlflow", action="store_true")
    ap.add_argument("--json", default=None, help="write metrics + server side here")
    ap.add_argument("--results-dir", default=None, metavar="ROOT",
                    help="write results/<experiment>/<UTC time>/ under ROOT (default: "
                         "results/ at the checkout's root, or $WORKBENCH_RESULTS_DIR)")
    ap.add_argument("--no-progress", action="store_true", help="no per-request progress bar")
    return ap


def _model_dir(model: str) -> str | None:
    from workbench.config.named_models import resolve_model

    model = resolve_model(model)
    return model if Path(model).is_dir() else None


def _workload(args: argparse.Namespace) -> Any:
    from workbench.harness.workloads import load_jsonl, make_workload
    from workbench.models.tokenizer import load_tokenizer

    tok_dir = args.tokenizer or _model_dir(args.model)
    if traces.is_trace(args.workload):
        traces.parse_trace_ref(args.workload)  # the spelling and the format, before the tokenizer
    elif Path(args.workload).is_file():
        return load_jsonl(args.workload, tokenizer=load_tokenizer(tok_dir) if tok_dir else None)
    if tok_dir is None:
        raise SystemExit(f"--model {args.model!r} is not a local folder: pass --tokenizer DIR "
                         "(the served model's tokenizer) to build the workload's prompts")
    params = _kv(args.param, "--param")
    if traces.is_trace(args.workload):
        return traces.trace_workload(args.workload, load_tokenizer(tok_dir), args.seed, params,
                                     args.num_requests)
    if args.num_requests is not None:
        params["num_requests"] = args.num_requests
    return make_workload(args.workload, args.seed, load_tokenizer(tok_dir), **params)


def _target_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The template-style target dict of `server_process.make_target`."""
    if args.target in ("inprocess", "in-process"):
        model = _model_dir(args.model)
        if model is None:
            raise SystemExit(f"--target inprocess needs --model as a local folder or 'bundled', "
                             f"not {args.model!r}")
        return {"kind": "in-process", "model": model}
    url = args.target.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SystemExit(f"--target {args.target!r} must be http://HOST:PORT/v1 or inprocess")
    if url.count("/") == 2:  # http://host:port -> the OpenAI base URL
        url += "/v1"
    spec = {"kind": "http", "base_url": url, "model": args.model, "endpoint": args.endpoint,
            "prompt_mode": args.prompt_mode, "temperature": args.temperature,
            "ignore_eos": not args.no_ignore_eos, "poll_interval_s": args.poll_interval,
            "ready_timeout_s": args.ready_timeout}
    if args.api_key:
        spec["api_key"] = args.api_key
    if args.server_cmd:
        spec["command"] = args.server_cmd
    return spec


def server_report(side: dict[str, Any], show_unchanged: bool = True) -> str:
    """The server side of an HTTP run as a Markdown table. `show_unchanged=False` (the
    console) leaves out the counters that did not move (a server exports dozens for features
    the run never used: KV transfer, offload tiers, speculation) and says how many; the
    results folder's summary.md keeps every row."""
    d, series = side["delta"], side["series"]
    lines = ["| Server side (/metrics, this run) | |", "|---|---:|"]
    for key in sorted(d):
        if key.endswith(":mean_delta") or key.endswith(":delta"):
            scale, unit = (1000.0, " (ms)") if "_seconds" in key else (1.0, "")
            lines.append(f"| {key}{unit} | {d[key] * scale:.2f} |")
    unchanged = 0
    for key in sorted(d):
        if key.endswith("_total") and "{" not in key:
            if d[key] == 0 and not show_unchanged:
                unchanged += 1
                continue
            lines.append(f"| Δ {key} | {d[key]:g} |")
    if unchanged:
        lines.append(f"| counters unchanged (Δ 0, listed in the results folder's summary.md) "
                     f"| {unchanged} |")
    for field in ("running", "waiting", "kv_cache_usage_perc"):
        vals = [r[field] for r in series if field in r]
        if vals:
            lines.append(f"| peak {field} ({len(vals)} polls) | {max(vals):g} |")
    lines.append(f"| Δcount check | {side['count_check'] or 'ok'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, cpu_watch: Any = None) -> None:
    """`cpu_watch`: a `validity.CpuWatch` to measure with (tests inject a fake)."""
    from workbench.harness.join import server_side
    from workbench.harness.metrics import summary_table
    from workbench.harness.server_process import run_variant

    ap = _parser()
    args = ap.parse_args(argv)
    if not 0 <= args.max_other_cpu_share <= 1:
        ap.error(f"--max-other-cpu-share ({args.max_other_cpu_share}) must be in [0, 1]")
    engine = _kv(args.engine, "--engine")
    workload = _workload(args)
    if args.arrivals is None:
        args.arrivals = (traces.default_arrivals(workload) if traces.is_trace(args.workload)
                         else traces.DEFAULT_ARRIVALS)
    traces.check_trace_arrivals(args.arrivals, workload)
    arrival = parse_arrivals(args.arrivals, args.seed, args.max_concurrency)
    result, target = run_variant(_target_spec(args), engine, workload, arrival,
                                 cache_state=args.cache_state,
                                 warmup_requests=args.warmup_requests,
                                 max_duration_s=args.max_duration,
                                 max_other_cpu_share=args.max_other_cpu_share,
                                 cpu_watch=cpu_watch, progress=not args.no_progress)
    metrics = result.metrics() if result.duration_s > 0 else {}
    side = server_side(result, target) if result.target.get("kind") == "http" else None
    print(summary_table(metrics) if metrics else "no measured requests")
    if (late := lateness_table(result.validity)) is not None:
        print(late)
    if side is not None:
        print("\n" + server_report(side, show_unchanged=False))
    if not result.validity.valid:
        print(f"\nINVALID run ({result.target.get('kind', '?')} {workload.name}): "
              + "; ".join(result.validity.reasons))
    if args.json:
        out = {"metrics": metrics, "validity": vars(result.validity), "target": result.target,
               "arrival": result.arrival, "cache_state": result.cache_state,
               "workload": workload.summary(), "error": result.error,
               "server_delta": side["delta"] if side else result.server_delta,
               "server_count_check": side["count_check"] if side else None,
               "server_series": side["series"] if side else []}
        Path(args.json).write_text(json.dumps(out, indent=2, default=_json_default))
    run_id = None
    if not args.no_mlflow:
        run_id = _log_mlflow(args, result, metrics, workload, target)
        print(f"\nMLflow run {run_id} (experiment {args.experiment!r})")
    folder = _write_results(args, result, metrics, workload, side, run_id)
    print(f"results folder: {folder}")
    if result.error:  # the run failed (exit 1); a refused input is exit 2
        print(f"workbench bench: the run failed: {result.error}", file=sys.stderr)
        raise SystemExit(1)


def _write_results(args: argparse.Namespace, result: Any, metrics: dict[str, float],
                   workload: Any, side: dict[str, Any] | None, run_id: str | None) -> Path:
    """results/<experiment>/<UTC time>/: summary.md (the console's tables), runs.csv and
    runs.json (one row: the run and its metrics), requests.csv (one row per request)."""
    from workbench.experiments.results import default_root, new_results_dir, write_rows
    from workbench.harness.metrics import records_frame, summary_table

    folder = new_results_dir(args.experiment, args.results_dir or default_root())
    text = summary_table(metrics) if metrics else "no measured requests"
    if (late := lateness_table(result.validity)) is not None:
        text += "\n" + late
    if side is not None:
        text += "\n\n" + server_report(side)
    (folder / "summary.md").write_text(text + "\n")
    row = {"target": args.target, "model": args.model, "workload": workload.name,
           "arrivals": args.arrivals, "cache_state": result.cache_state, "run_id": run_id,
           "status": "FAILED" if result.error else "FINISHED",
           "valid": result.validity.valid, "error": result.error, **metrics}
    write_rows(folder, [row], list(row)[:len(row) - len(metrics)])  # then metrics, sorted
    (folder / "requests.csv").write_text(records_frame(result.records).to_csv(index=False))
    return folder


def _json_default(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else str(v)


def _log_mlflow(args: argparse.Namespace, result: Any, metrics: dict[str, float],
                workload: Any, target: Any) -> str:
    import pandas as pd

    from workbench.harness.join import log_server_side
    from workbench.harness.metrics import records_frame, summary_table
    from workbench.tracking.mlflow_store import Store
    from workbench.tracking.param_keys import arrival_params, trace_keys

    store = Store(args.experiment, args.tracking_uri)
    kind = result.target.get("kind", "?")
    run_id = store.create_run(f"{kind} {workload.name}", tags={
        "kind": "bench", "target": args.target, "workload_checksum": workload.checksum,
        "open_loop": str(result.open_loop)})
    store.log_params(run_id, {"target": result.target, "workload": workload.summary(),
                              **arrival_params(result.arrival or {}),  # request_rate, ...
                              **trace_keys(workload),  # workload.trace.* (a trace only)
                              "cache_state": result.cache_state})
    store.log_metrics(run_id, metrics)
    v = result.validity
    store.log_validity(run_id, v.valid, v.reasons, v.other_cpu_share, v.max_other_cpu_share)
    files: dict[str, str | bytes] = {"requests.csv": records_frame(result.records).to_csv(
        index=False)}
    if metrics:
        files["summary.md"] = summary_table(metrics)
    if result.step_trace:
        files["step_trace.csv"] = pd.DataFrame(result.step_trace).to_csv(index=False)
        store.log_series(run_id, result.step_trace, ["running", "waiting", "kv_cache_usage_perc"])
    store.log_files(run_id, files)
    if kind == "http":
        log_server_side(store, run_id, result, target)
    store.finish(run_id, failed=result.error is not None)
    return run_id
