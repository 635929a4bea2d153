"""`workbench` command line: argparse subparsers, one per verb; the module that owns a verb
parses its flags (`workbench <verb> --help`). `workbench --help` lists the verbs.

    workbench run experiments/X.yaml [--tracking-uri URI] [--profile torch] [--promote OUT]
                                     [--resume] [--retry-invalid N]
                                     [--results-dir ROOT] [--executor local|ray]
                                     [--address HOST:PORT] [--allow-mixed-hardware]
                                     run an experiment template, print the verdict table;
                                     write results/<name>/<UTC time>/ (run, bench, sweep);
                                     --executor ray: each run a Ray task on a cluster
                                     (docs/cluster.md)
    workbench promote PARENT_RUN_ID --out OUT.yaml [--tracking-uri URI]
                                     write the adopted config as the new baseline template
    workbench sweep notebooks/X.ipynb -p NAME V1 V2 ... [--set k=v] [--resume]
                                     [--retry-invalid N] [--kernel NAME]
                                     [--executor local|ray] [--address HOST:PORT]
                                     one papermill run per value, each an MLflow child run;
                                     values checked first; prints the parent run's link
    workbench rerun RUN_ID [--repeats N] [--tracking-uri URI] [--results-dir ROOT]
                                     measure a logged experiment run or sweep point again;
                                     logged | now | delta % | same or drifted beyond noise
    workbench bench --target http://HOST:PORT/v1|inprocess --model NAME --workload FIXTURE
                                     one measured run against any OpenAI server or the engine
    workbench serve --model DIR [every engine knob as a flag] [--host] [--port] [--api-key]
                                     the OpenAI-compatible server with vLLM's /metrics
    workbench router --num-replicas N --policy round_robin|least_outstanding|prefix_aware
                     [--port] [every `workbench serve` flag]
                                     N serve replicas behind one router (retry on failure)
    workbench disagg --num-prefill P --num-decode M [--prefill-policy] [--decode-policy]
                     [every `workbench router` / `workbench serve` flag]
                                     the router with P prefill + M decode replicas
    workbench bench offline [...]    engine vs transformers (and vLLM-CPU) throughput table
    workbench bench sched [...]      scheduler + KV manager cost per step
    workbench bench spec [...]       speculative decoding on vs off (n-gram, draft model)
    workbench bench kv-cache [...]   KV-cache bookkeeping cost (allocate_slots, get_block_ids)
    workbench bench gpu-check OUTDIR [--quick]
                                     the device check (kernels vs torch twins, graphs, TP)
    workbench bench pd-capacity --model DIR --input-len N --output-len N --batch B
                    --num-workers W   prefill / decode tok/s per instance -> planning.pd_ratio
    workbench bench pd-push --model DIR --input-len N
                                     disaggregated KV hand-over: pull vs push, side by side
    workbench bench client-capacity [--rates R1,R2,...] [--no-vllm]
                                     the load generator's ceiling against a mock server
    workbench calc {kv,budget,blocks,prefix,passes,decode,spec,spec-counters,tp,transfer,
                    pd,roofline} [...]
    workbench preflight [--json] [--out F] [--compare OLD.json]
    workbench demo-engine [...]      generate from the bundled checkpoint, print a report
    workbench needle [--model needle] [--engine JSON] [--lengths N ...] [--depths D ...]
                     [--export CASES.jsonl]
                                     passkey accuracy grid (depth x length) through the engine
    workbench ui [--port 5000] [--tracking-uri URI]
                                     the MLflow UI on the store, bound to 127.0.0.1

Global flag: --debug (anywhere) shows the Python traceback of an error.
Exit status: 0 done; 1 it ran but did not succeed (every baseline run failed, so no verdict;
a sweep point failed; a bench run failed) or an internal error (a bug: the line says so);
2 the input was refused (a flag, a file, a template, a value): one line on stderr,
`workbench <verb>: <message>`, and no traceback; 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM; `workbench run`: the runs in flight are KILLED in MLflow, `--resume` finishes).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

MLFLOW_UI = "workbench ui  (mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db)"


def _run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="workbench run", description="Run an experiment template.")
    ap.add_argument("template")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--profile", choices=["torch"], default=None,
                    help="store a torch.profiler Chrome trace per run as an MLflow artifact")
    ap.add_argument("--promote", default=None, metavar="OUT.yaml",
                    help="write the adopted config as a new baseline template here")
    ap.add_argument("--max-other-cpu-share", type=float, default=None, metavar="SHARE",
                    help="a run is invalid (never compared) when other processes used more "
                         "than this share of the CPUs meanwhile (default: the template's "
                         "max_other_cpu_share, else 0.25)")
    ap.add_argument("--resume", action="store_true",
                    help="finish the newest run of this template and workload: its FINISHED "
                         "runs are kept, runs left RUNNING by a dead driver or node are "
                         "marked KILLED, and every missing (value, repeat) is measured")
    ap.add_argument("--retry-invalid", type=int, default=0, metavar="N",
                    help="measure a run disturbed by other processes again, up to N times "
                         "(after the template's repeats, interleaved; default 0)")
    _add_results_dir(ap)
    _add_next_variable(ap)
    from workbench.experiments.executors.config import add_executor_args, executor_config

    add_executor_args(ap)
    args = ap.parse_args(argv)
    if args.max_other_cpu_share is not None and not 0 <= args.max_other_cpu_share <= 1:
        ap.error(f"--max-other-cpu-share ({args.max_other_cpu_share}) must be in [0, 1]")
    if args.retry_invalid < 0:
        ap.error(f"--retry-invalid ({args.retry_invalid}) must be >= 0 (the times a disturbed "
                 "run is measured again)")
    executor_config(args)  # the executor flags alone, before the template is read
    from workbench.experiments.promote import promote
    from workbench.experiments.run_record import run_label
    from workbench.experiments.runner import run_experiment
    from workbench.experiments.template import load_template

    template = load_template(args.template)  # every problem at once, before any run
    next_variable = _next_variable(ap, args)
    executor = executor_config(args, template.raw.get("cluster"))  # flags over the template
    result = run_experiment(template, uri=args.tracking_uri, profile=args.profile,
                            max_other_cpu_share=args.max_other_cpu_share,
                            results_dir=_results_root(args), executor=executor,
                            resume=args.resume, retry_invalid=args.retry_invalid)
    print(f"\n# {template.name}\n{template.question}\n")
    print(result.table)
    adopted = ("nothing" if result.adopted is None else
               f"{run_label(template, result.adopted)} ({result.adopted})")
    print(f"\nadopted: {adopted}"
          f"  (MLflow parent run {result.parent_run_id})")
    if args.promote:
        out = promote(template, result, args.promote, next_variable=next_variable)
        print(f"new baseline template: {out}" if out else "nothing adopted: no template written")
    print(f"open the results: {MLFLOW_UI}" if args.tracking_uri is None
          else f"results in {result.tracking_uri}")
    _print_compare_urls(result, template)
    print(f"results folder: {result.results_dir}")
    if result.advice:  # invalid runs: what to do, the last line
        print(result.advice)
    if not result.verdicts:
        first = next((r.error for r in result.runs if r.error), "unknown")
        print(f"workbench run: {result.no_verdict}" if result.no_verdict and
              not result.no_verdict.startswith("every baseline") else
              f"workbench run: every baseline run failed, so there is no verdict; first error: "
              f"{first}", file=sys.stderr)
        raise SystemExit(1)


def _add_results_dir(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--results-dir", default=None, metavar="ROOT",
                    help="write results/<name>/<UTC time>/ under ROOT (default: results/ at "
                         "the checkout's root, or $WORKBENCH_RESULTS_DIR)")


def _results_root(args: argparse.Namespace) -> str:
    from workbench.experiments.results import default_root

    return str(args.results_dir or default_root())


def _print_compare_urls(result: Any, template: Any) -> None:
    """The runs table of this experiment's children sorted by the objective, and MLflow's
    compare page on them (`workbench ui` serves both on 127.0.0.1:5000)."""
    objective = template.objective
    try:
        from workbench.experiments.results import VERDICT_MD
        from workbench.tracking.ui import experiment_urls, run_artifact_url

        uri = result.tracking_uri  # a tracking server serves its own UI; else `workbench ui`
        base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else None
        table, compare = experiment_urls(uri, result.parent_run_id, objective.metric,
                                         objective.direction == "minimize", base=base)
        verdict = run_artifact_url(uri, result.parent_run_id, VERDICT_MD, base=base)
    except Exception as e:  # noqa: BLE001 - the results are logged; only the links are lost
        print(f"(no MLflow links: {type(e).__name__}: {e})")
        return
    print(f"verdict (the parent run's table): {verdict}")
    print(f"compare (the objective per value): {table}")
    print(f"compare page (scatter: x = the knob's param, y = {objective.metric}): {compare}")


def _add_next_variable(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--next-variable", default=None, metavar="NAME",
                    help="the promoted template's variable (default: the same one, with the "
                         "values not adopted and the old baseline value)")
    ap.add_argument("--values", nargs="+", default=None, metavar="V",
                    help="the values of --next-variable (JSON or text)")


def _next_variable(ap: argparse.ArgumentParser, args: argparse.Namespace
                   ) -> tuple[str, list[object]] | None:
    if (args.next_variable is None) != (args.values is None):
        ap.error("--next-variable and --values go together: --next-variable NAME --values V ...")
    if args.next_variable is None:
        return None
    from workbench.sweeps.cli import parse_value

    return args.next_variable, [parse_value(v) for v in args.values]


def _promote(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="workbench promote")
    ap.add_argument("parent_run_id")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tracking-uri", default=None)
    _add_next_variable(ap)
    args = ap.parse_args(argv)
    next_variable = _next_variable(ap, args)
    # no "Downloading artifacts" bars for the two small files it reads (mlflow reads the
    # variable at each download)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from workbench.experiments.promote import promote_from_mlflow

    out = promote_from_mlflow(args.parent_run_id, args.out, args.tracking_uri,
                              next_variable=next_variable)
    print(f"new baseline template: {out}" if out else "that experiment adopted nothing")


def run_sweep_point(notebook: Any, param: str, value: Any, fixed: dict[str, Any], *,
                    store: Any, parent: str, out: Any, max_other_cpu_share: float | None = None,
                    cpu_watch: Any = None) -> dict[str, Any]:
    """One sweep point executed as `workbench sweep` executes it (its row), for `workbench
    rerun`: the experiments layer may not import the sweep (an entrypoint), so it is handed
    this function."""
    from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, default_cpu_watch
    from workbench.sweeps.inputs import declared_parameters
    from workbench.sweeps.notebook_run import run_point
    from workbench.sweeps.report import value_key

    ctx = {"store": store, "parent": parent, "nb": notebook, "param": param, "fixed": fixed,
           "declared": declared_parameters(notebook), "kernel_name": None, "values": [value],
           "max_other_cpu_share": DEFAULT_MAX_OTHER_CPU_SHARE if max_other_cpu_share is None
           else max_other_cpu_share,
           "cpu_watch": cpu_watch if cpu_watch is not None else default_cpu_watch()}
    return run_point(ctx, value, value_key(value), out)


def _rerun(argv: list[str]) -> None:
    from workbench.experiments.rerun import main as rerun_main

    rc = rerun_main(argv, run_point=run_sweep_point)
    if rc:
        raise SystemExit(rc)


def _lazy(module: str) -> Callable[[list[str]], None]:
    def call(argv: list[str]) -> None:
        import importlib

        rc = importlib.import_module(module).main(argv)
        if isinstance(rc, int) and rc:
            raise SystemExit(rc)

    return call


# verb -> (one line for `workbench --help`, what runs it)
COMMANDS: dict[str, tuple[str, Callable[[list[str]], None]]] = {
    "run": ("run an experiment template, print the verdict table", _run),
    "promote": ("write an experiment's adopted config as the new baseline template", _promote),
    "sweep": ("one papermill run of a notebook per parameter value (MLflow child runs)",
              _lazy("workbench.sweeps.cli")),
    "rerun": ("measure a logged experiment run or sweep point again: same or drifted?",
              _rerun),
    "bench": ("a measured run against a server or the engine; bench offline|sched|spec|...",
              _lazy("workbench.bench.cli")),
    "serve": ("the OpenAI-compatible server with vLLM's /metrics", _lazy("workbench.server.serve")),
    "router": ("N serve replicas behind one router (retry on failure)",
               _lazy("workbench.router.cli")),
    "disagg": ("the router with P prefill + M decode replicas (disaggregated serving)",
               _lazy("workbench.router.disagg_cli")),
    "calc": ("KV / memory / speculative / TP arithmetic (kv, budget, blocks, prefix, ...)",
             _lazy("workbench.planning.cli")),
    "calibrate": ("fit the simulator's step-time cost model to this machine's engine",
                  _lazy("workbench.sim.calibrate")),
    "sim-search": ("simulate a grid of configurations, choose the cheapest meeting an SLO",
                   _lazy("workbench.sim.search_cli")),
    "preflight": ("check this machine and environment before measuring",
                  _lazy("workbench.platforms.preflight")),
    "demo-engine": ("generate from the bundled checkpoint, print a report",
                    _lazy("workbench.demo")),
    "needle": ("passkey retrieval accuracy by depth x length (the KV quality gate's task)",
               _lazy("workbench.experiments.needle")),
    "ui": ("the MLflow UI on ./mlruns at 127.0.0.1:5000 (Ctrl-C stops it)",
           _lazy("workbench.tracking.ui")),
}
# `workbench bench <name>`: the benchmark scripts (without a name: the serving run above)
BENCH: dict[str, tuple[str, Callable[[list[str]], None]]] = {
    "offline": ("engine vs transformers (and vLLM-CPU) offline throughput table",
                _lazy("workbench.bench.offline.throughput")),
    "sched": ("scheduler + KV manager cost per step", _lazy("workbench.bench.micro.sched")),
    "spec": ("speculative decoding on vs off (n-gram, draft model)",
             _lazy("workbench.bench.offline.spec")),
    "kv-cache": ("KV-cache bookkeeping micro-benchmark (allocate_slots, get_block_ids)",
                 _lazy("workbench.bench.micro.kv_cache")),
    "gpu-check": ("the one-script device check (kernels vs torch twins, CUDA graphs, TP)",
                  _lazy("workbench.bench.gpu.check")),
    "pd-capacity": ("one instance's prefill and decode tok/s and the P:D split they imply",
                    _lazy("workbench.bench.disagg.capacity")),
    "pd-push": ("the disaggregated KV hand-over, pull vs push (prefill leg, decode first token)",
                _lazy("workbench.bench.disagg.push")),
    "client-capacity": ("the load generator's own ceiling against a mock server (vs vLLM's client)",
                        _lazy("workbench.bench.client_capacity.cli")),
}

EPILOG = """global flag: --debug (anywhere) shows the Python traceback of an error.
exit status: 0 done; 1 it ran but did not succeed, or an internal error (the line says so);
2 the input was refused (one line on stderr: `workbench <verb>: <message>`); 130 interrupted
(Ctrl-C), 143 terminated (SIGTERM).
`workbench <verb> --help` shows the verb's flags."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: one subparser per verb. A verb's own flags are parsed by the
    module that owns it (`workbench serve --help` shows every engine knob), so each subparser
    takes whatever follows the verb."""
    ap = argparse.ArgumentParser(
        prog="workbench", description="An LLM-serving research workbench.",
        epilog=EPILOG,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(
            prog, max_help_position=16, width=110),
    )
    verbs = ap.add_subparsers(dest="command", metavar="VERB", title="verbs")
    for name, (line, _) in COMMANDS.items():
        sub = verbs.add_parser(name, help=line, add_help=False)
        if name == "bench":
            sub.description = "benchmarks: " + "; ".join(
                f"bench {b}: {help_line}" for b, (help_line, _) in BENCH.items())
    return ap


def is_user_error(exc: BaseException) -> bool:
    """Input the user can fix: UserError / ValueError (the configs' refusals), a missing or
    unreadable file, a YAML error, an MLflow refusal (unknown run id, ...)."""
    if isinstance(exc, ValueError | FileNotFoundError | PermissionError | IsADirectoryError
                  | NotADirectoryError):
        return True
    yaml = sys.modules.get("yaml")
    if yaml is not None and isinstance(exc, yaml.YAMLError):
        return True
    mlflow_exceptions = sys.modules.get("mlflow.exceptions")
    return mlflow_exceptions is not None and isinstance(exc, mlflow_exceptions.MlflowException)


def error_line(prog: str, exc: BaseException) -> str:
    """The one line (a template's problems: one per line below it) a failed command prints."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        message = f"{exc.strerror}: {str(exc.filename)!r}"
    else:
        message = str(exc).strip() or type(exc).__name__
    if is_user_error(exc):
        return f"{prog}: {message}"
    return (f"{prog}: internal error (a bug, not your input): {type(exc).__name__}: {message}"
            "; rerun with --debug for the traceback and report it")


def guarded(prog: str, fn: Callable[[list[str]], None], argv: list[str],
            debug: bool = False) -> None:
    """Run one verb; an exception becomes one line on stderr and an exit status
    (module docstring), the traceback only with `debug`. argparse parsers without a `prog`
    take theirs from sys.argv[0]: it is `prog` meanwhile, so their errors name the verb."""
    saved = sys.argv
    sys.argv = [prog, *argv]
    try:
        fn(argv)
    except SystemExit as e:
        if isinstance(e.code, str):  # `raise SystemExit("message")`: a refusal
            if debug:
                traceback.print_exc()
            print(f"{prog}: {e.code}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    except KeyboardInterrupt as e:  # Ctrl-C; SIGTERM where a verb raises it (`workbench run`)
        if debug:
            traceback.print_exc()
        print(f"{prog}: {str(e).strip() or 'interrupted'}", file=sys.stderr)
        raise SystemExit(128 + int(getattr(e, "signum", 2))) from None  # 130, 143
    except Exception as e:  # noqa: BLE001 - every error ends as one line and a status
        _fail(prog, e, debug)
    finally:
        sys.argv = saved


def _fail(prog: str, exc: BaseException, debug: bool) -> NoReturn:
    if debug:
        traceback.print_exception(exc)
    print(error_line(prog, exc), file=sys.stderr)
    raise SystemExit(2 if is_user_error(exc) else 1) from None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("WORKBENCH_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    ap = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"workbench: unknown command {cmd!r}; commands: {', '.join(COMMANDS)} "
              "(workbench --help)", file=sys.stderr)
        raise SystemExit(2)
    ns, rest = ap.parse_known_args([cmd, *rest])
    assert ns.command == cmd
    if cmd == "bench" and rest and rest[0] in BENCH:
        guarded(f"workbench bench {rest[0]}", BENCH[rest[0]][1], rest[1:], debug)
    else:  # `workbench bench` alone: --target URL|inprocess --model ... --workload ...
        guarded(f"workbench {cmd}", COMMANDS[cmd][1], rest, debug)


if __name__ == "__main__":
    main()
