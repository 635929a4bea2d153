"""`workbench sweep NOTEBOOK -p NAME V1 V2 ... [--set k=v] [--resume] ...`: the command line of
`workbench.sweeps.driver.sweep` (also `python -m workbench.sweeps.cli`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.sweeps.driver import sweep
from workbench.sweeps.notebook_run import absolute_uri
from workbench.sweeps.report import summary_table


def parse_value(text: str) -> Any:
    """JSON when it parses ("8", "1e3", "true", "[1, 2]", "null"), else the string itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench sweep",
        description="Run a papermill notebook once per parameter value; log each run to MLflow.")
    ap.add_argument("notebook", help="the .ipynb to run (it should have a `parameters` cell)")
    ap.add_argument("-p", "--param", nargs="+", required=True, metavar="NAME_THEN_VALUES",
                    help="the parameter name followed by its values: -p NAME V1 V2 ...")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a fixed parameter for every run (repeatable)")
    ap.add_argument("--resume", action="store_true",
                    help="skip values that already FINISHED in the latest sweep of this param")
    ap.add_argument("--tracking-uri", default=None, help="MLflow URI (default: ./mlruns)")
    ap.add_argument("--experiment", default=None, help="MLflow experiment (sweep-<stem>)")
    ap.add_argument("--results-dir", default=None, metavar="ROOT",
                    help="write results/<experiment>/<UTC time>/ (notebooks/, runs.csv, "
                    "runs.json, summary.md) under ROOT (default: results/ at the checkout's "
                    "root, or $WORKBENCH_RESULTS_DIR)")
    ap.add_argument("--out-dir", dest="results_dir", help=argparse.SUPPRESS)  # the old name
    ap.add_argument("--kernel", default=None, help="Jupyter kernel name (the notebook's)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--max-other-cpu-share", type=float, default=None, metavar="SHARE",
                    help="mark a point invalid when other processes used more than this share "
                    "of the machine's CPUs while it ran (default 0.25)")
    ap.add_argument("--retry-invalid", type=int, default=0, metavar="N",
                    help="run each INVALID (disturbed) point again, up to N times "
                    "(default 0)")
    from workbench.experiments.executors.config import add_executor_args

    add_executor_args(ap, verdict=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    """CLI entry; exit status 1 when any point failed."""
    ap = _parser()
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if len(args.param) < 2:
        ap.error("-p needs a parameter name and at least one value: -p NAME V1 [V2 ...]")
    fixed: dict[str, Any] = {}
    for item in args.set:
        key, sep, text = item.partition("=")
        if not sep or not key:
            ap.error(f"--set {item!r} must look like KEY=VALUE")
        fixed[key] = parse_value(text)
    name, values = args.param[0], [parse_value(v) for v in args.param[1:]]
    from workbench.experiments.executors.config import executor_config

    try:
        rows = sweep(args.notebook, name, values, fixed=fixed, experiment=args.experiment,
                     uri=args.tracking_uri, resume=args.resume, results_dir=args.results_dir,
                     kernel_name=args.kernel, progress=not args.no_progress,
                     max_other_cpu_share=args.max_other_cpu_share,
                     executor=executor_config(args), retry_invalid=args.retry_invalid)
    except ValueError as e:
        print(f"workbench sweep: {e}", file=sys.stderr)
        return 2
    if rows:
        _print_end(rows, name, args.tracking_uri)
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


def _print_end(rows: list[dict[str, Any]], param: str, uri: str | None) -> None:
    """The summary (as summary.md), the MLflow links, the results folder; last, on stderr,
    what to do when points came back INVALID."""
    from workbench.harness.validity import invalid_advice
    from workbench.sweeps.report import SUMMARY_MD, links
    from workbench.tracking.mlflow_store import tracking_uri

    folder = Path(rows[0]["results_dir"])
    summary = folder / SUMMARY_MD  # absent only when the report failed (a line said so)
    print(summary.read_text().rstrip("\n") if summary.is_file() else summary_table(rows, param))
    for line in links(tracking_uri(absolute_uri(uri)), rows[0]["parent_run_id"]):
        print(line)
    if uri is None:
        print("open them with: workbench ui")
    print(f"results folder: {folder}")
    measured = [r for r in rows if r["status"] != "SKIPPED"]
    advice = invalid_advice(sum(not r["valid"] for r in measured), len(measured))
    if advice:
        print(f"workbench sweep: {advice} (--retry-invalid N runs them again at once; "
              "--resume later reruns only them)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
