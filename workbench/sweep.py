"""`workbench sweep`: run one papermill notebook per parameter value, each logged to MLflow.

    sweep("notebooks/03_chunked_prefill_sweep.ipynb", "num_requests", [8, 16])
    workbench sweep notebooks/X.ipynb -p NAME V1 V2 ... [--set k=v ...] [--resume]
                    [--tracking-uri URI] [--experiment NAME] [--results-dir ROOT]
                    [--kernel NAME] [--executor local|ray] [--address HOST:PORT]
                    [--max-other-cpu-share SHARE] [--retry-invalid N]

    before the first point: names and values checked against the notebook's declarations,
    the kernel resolved (`workbench.sweep_inputs`), the machine's load watched (a warning)

    parent run  (tags: kind=sweep, notebook=<absolute path>, sweep_param, sweep_values, fixed,
                 sweep_step, sweep_metrics, invalid_points); at the end its description,
                 per-point metrics, summary.md and sweep.png (`workbench.sweep_report`)
      child run per value, named by its label ("budget=64": experiments.labels)
                  (tags: sweep_param, sweep_value=<JSON>, output_path[, error])
        params    = the notebook's parameters: its declared defaults, then {param: value, **fixed},
                    knob names as on every path (tracking.param_keys: budgets ->
                    max_num_batched_tokens, rate -> request_rate)
        artifacts = the executed notebook (also when it failed) [+ error.txt]
        status    = FINISHED, or FAILED with the error; the sweep goes on past a failed point
        validity  = tags run_valid, validity; metrics valid, other_cpu_share (tracking.Store)

Each value runs `papermill.execute_notebook` with cwd = the notebook's folder (as JupyterLab
does) into the sweep's results folder, <results_dir>/<experiment>/<UTC time>/notebooks/
<i>_<param>=<value>.ipynb (default root: results/ at the checkout's root,
`workbench.experiments.results`); the folder also holds runs.csv, runs.json (one row per
point: status, validity, the metrics the notebook logged), summary.md (the table the
command prints) and sweep.png. The kernel talks to papermill over IPC sockets
(`IpcKernelManager`), not TCP: no "running over TCP without encryption" warning per point.
When the
notebook declares `mlflow_parent_run_id`, `mlflow_uri` or `mlflow_experiment` in its
`parameters` cell, they are injected (this point's child run, the store, the experiment) so the
notebook can log into the sweep; see `workbench.analysis.notebook.publish`.

`resume=True` reuses the latest sweep parent for (notebook, param) in the experiment and skips
the values that already have a FINISHED, valid child there (rows with status "SKIPPED" and the
earlier run's id; its executed notebook, found through the run's output_path tag, is copied
into the new folder); failed, disturbed and new values run again as new child runs. A child
still RUNNING whose sweep process is gone (killed with SIGKILL, say) is marked KILLED first
and a line on stderr says so (`mark_killed`); its value runs again.

`executor=ExecutorConfig("ray", ...)` (`--executor ray [--address HOST:PORT]`) runs each
point as a Ray task holding one node of a cluster and logging to a tracking server
(`workbench.sweep_points`, docs/cluster.md); every point's run is tagged with its node
(node, node_hostname, hardware_fingerprint) either way.

Each point is measured inside a `validity.CpuWatch` (the notebook's kernel is a child process,
so it counts as this run's own): when other processes took more than `max_other_cpu_share` of
the machine's CPUs meanwhile, the point is marked invalid (row `valid`: False, a line on
stderr, MLflow tag run_valid=false); its numbers should not be read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import tempfile
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.sweep_inputs import (  # noqa: F401 - re-exported (cli, tests)
    check_names,
    check_values,
    declared_parameters,
    kernel_language,
)
from workbench.sweep_report import (  # noqa: F401 - re-exported: the sweep's summary
    KEY_METRICS,
    key_metrics,
    point_metrics,
    status_text,
    summary_table,
    value_key,
)

if TYPE_CHECKING:
    from workbench.experiments.executors.base import Executor
    from workbench.experiments.executors.config import ExecutorConfig

INJECTED = ("mlflow_parent_run_id", "mlflow_uri", "mlflow_experiment")
PARENT_TAG = "mlflow.parentRunId"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _slug(value: Any) -> str:
    text = value if isinstance(value, str) else value_key(value)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:60] or "_"


def _absolute_uri(uri: str | None) -> str | None:
    """A relative sqlite URI made absolute (the notebook runs in another folder)."""
    prefix = "sqlite:///"
    if uri and uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


KERNEL_SHUTDOWN_WAIT_S = 30.0  # jupyter_client's 5 s default is short on 2 busy CPUs


def _ipc_kernel_manager() -> type:
    """jupyter_client's AsyncKernelManager on IPC transport (Unix sockets): ipykernel >= 7
    warns on every start over plain TCP. The sockets' path prefix is absolute and unique per
    kernel: jupyter_client's default is the relative "kernel-ipc", numbered from 1 by what
    already exists, so two kernels started at once in one folder (two sweep points on the
    nodes of a one-machine Ray cluster) took the same sockets and read each other's messages
    ("Invalid Signature", or no answer in 60 s). A kernel that has not exited 5 s after its
    shutdown request is interrupted (an "[IPKernelApp] ERROR | KeyboardInterrupt caught in
    kernel" line) on a loaded machine: it gets 30 s."""
    from jupyter_client import AsyncKernelManager
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):  # type: ignore[misc]
        @default("transport")
        def _transport_default(self) -> str:
            return "ipc" if os.name == "posix" else "tcp"

        @default("ip")
        def _ip_default(self) -> str:
            if self.transport != "ipc":
                return str(super()._ip_default())
            # "<tmp>/wb-kernel-<12 hex>-<n>": short enough for a Unix socket path
            return os.path.join(tempfile.gettempdir(), f"wb-kernel-{uuid.uuid4().hex[:12]}")

        @default("shutdown_wait_time")
        def _shutdown_wait_time_default(self) -> float:
            return KERNEL_SHUTDOWN_WAIT_S

    return IpcKernelManager


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool, desc: str) -> Any:
    """A tqdm bar of points on stderr (`update`, `close`), or one that shows nothing."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with transformers; no bar without it
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="point", file=sys.stderr)


def sweep(
    notebook: str | Path,
    param: str,
    values: Sequence[Any],
    *,
    fixed: dict[str, Any] | None = None,
    experiment: str | None = None,
    uri: str | None = None,
    resume: bool = False,
    results_dir: str | Path | None = None,
    out_dir: str | Path | None = None,
    kernel_name: str | None = None,
    progress: bool = True,
    max_other_cpu_share: float | None = None,
    cpu_watch: Any = None,
    executor: ExecutorConfig | None = None,
    retry_invalid: int = 0,
    load_watch: Any = None,
) -> list[dict[str, Any]]:
    """One papermill run per value; one row per value: {value, status, output_path, run_id,
    error, valid, other_cpu_share, metrics, results_dir}. status is FINISHED, FAILED or
    (resume) SKIPPED; metrics: what the point's run logged (`point_metrics`). The folder
    <results_dir>/<experiment>/<UTC time>/ (root default: `results.default_root()`; `out_dir`
    is its old name) holds notebooks/, runs.csv, runs.json and summary.md.
    `max_other_cpu_share` (default validity.DEFAULT_MAX_OTHER_CPU_SHARE) and `cpu_watch`
    (default validity.default_cpu_watch()) judge each point's disturbance. `executor`: an
    `executors.ExecutorConfig` (default: local, here one point after another).
    Before anything runs: every value is checked against the notebook's declared parameter
    types (`check_values`), the kernel is resolved (`kernel_language`), and (locally) the
    machine's load is watched for a second (`load_watch`, default like `cpu_watch`): a
    warning line on stderr when others already take more than the threshold.
    `retry_invalid`: run each INVALID (disturbed) point again up to this many times; the
    last try's row is kept. Every row carries `parent_run_id` and `results_dir`."""
    from workbench.experiments.executors.config import ExecutorConfig, check_tracking_uri
    from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE, default_cpu_watch

    if max_other_cpu_share is None:
        max_other_cpu_share = DEFAULT_MAX_OTHER_CPU_SHARE
    if not 0 <= max_other_cpu_share <= 1:
        raise ValueError(f"max_other_cpu_share ({max_other_cpu_share}) must be in [0, 1]")
    if isinstance(retry_invalid, bool) or not isinstance(retry_invalid, int) or \
            retry_invalid < 0:
        raise ValueError(f"retry_invalid ({retry_invalid!r}) must be an integer >= 0")

    nb = Path(notebook).resolve()
    if not nb.is_file():
        raise ValueError(f"notebook ({str(notebook)!r}) is not a file")
    values, fixed = list(values), dict(fixed or {})
    if not values:
        raise ValueError("values is empty; give at least one value to sweep")
    keys = [value_key(v) for v in values]
    if len(set(keys)) != len(keys):
        raise ValueError(f"values ({values}) contain duplicates; give each value once")
    language = kernel_language(nb, kernel_name)
    declared = declared_parameters(nb, kernel_name, language)
    check_names(declared, param, fixed, nb)
    check_values(nb, declared, param, values, fixed)
    config = executor or ExecutorConfig()
    check_tracking_uri(config, uri)
    if config.kind == "local":  # on a cluster each node's load is its own
        _warn_if_busy(load_watch if load_watch is not None else default_cpu_watch(),
                      max_other_cpu_share)
    from workbench.experiments.executors.factory import make_executor

    ex = make_executor(config)  # a cluster: connected, its node resource checked
    try:
        return _sweep(ex, nb, param, values, keys, fixed, declared, experiment=experiment,
                      uri=uri, resume=resume, root=results_dir if results_dir is not None
                      else out_dir, kernel_name=kernel_name, language=language,
                      progress=progress, max_other_cpu_share=max_other_cpu_share,
                      cpu_watch=cpu_watch if cpu_watch is not None else default_cpu_watch(),
                      retry_invalid=retry_invalid)
    finally:
        ex.close()


def _warn_if_busy(watch: Any, threshold: float) -> None:
    from workbench.harness.validity import busy_machine_line, load_before_start

    line = busy_machine_line(load_before_start(watch), threshold)
    if line is not None:
        print(f"workbench sweep: {line}", file=sys.stderr, flush=True)


def _sweep(ex: Executor, nb: Path, param: str, values: list[Any], keys: list[str],
           fixed: dict[str, Any], declared: dict[str, Any], *, experiment: str | None,
           uri: str | None, resume: bool, root: str | Path | None, kernel_name: str | None,
           language: str | None, progress: bool, max_other_cpu_share: float, cpu_watch: Any,
           retry_invalid: int) -> list[dict[str, Any]]:
    """`sweep` once its input is checked and the executor `ex` is ready."""
    from workbench.analysis.notebook import ensure_experiment
    from workbench.sweep_points import run_points
    from workbench.tracking.mlflow_store import Store, tracking_uri

    name = experiment or f"sweep-{nb.stem}"
    ensure_experiment(name, tracking_uri(_absolute_uri(uri)))
    store = Store(name, _absolute_uri(uri))
    parent = _latest_parent(store, nb, param) if resume else None
    done = _finished_points(store, parent) if parent else {}
    if parent:
        for line in mark_killed(store, parent):
            print(f"workbench sweep: {line}", file=sys.stderr, flush=True)
    if parent is None:
        parent = store.create_run(f"sweep {nb.stem} {param}", tags={
            "kind": "sweep", "notebook": str(nb), "notebook_name": nb.name,
            "sweep_param": param, "sweep_values": json.dumps(keys), "fixed": value_key(fixed)})
        store.log_params(parent, {"notebook": str(nb), "param": param, "fixed": fixed})
    else:
        old = json.loads(store.client.get_run(parent).data.tags.get("sweep_values", "[]"))
        store.set_tags(parent, {"sweep_values": json.dumps(list(dict.fromkeys(old + keys)))})
        store.client.update_run(parent, status="RUNNING")
    from workbench.experiments.results import new_results_dir

    folder = new_results_dir(name, root)
    run_dir = folder / "notebooks"
    run_dir.mkdir(parents=True, exist_ok=True)
    slots: list[dict[str, Any] | None] = [None] * len(values)
    ctx = {"store": store, "parent": parent, "nb": nb, "param": param, "fixed": fixed,
           "declared": declared, "kernel_name": kernel_name, "language": language,
           "values": values,
           "max_other_cpu_share": max_other_cpu_share, "cpu_watch": cpu_watch}
    bar = _progress(len(values), progress, f"{nb.stem} {param}")
    todo: list[int] = []
    for i, value in enumerate(values):
        if keys[i] in done:
            run_id, output = done[keys[i]]
            output = _copy_notebook(output, run_dir)
            slots[i] = {"value": value, "status": "SKIPPED", "output_path": output,
                        "run_id": run_id, "error": None, "valid": True,
                        "other_cpu_share": None, "node": None}
            bar.update(1)
        else:
            todo.append(i)
    points = [(values[i], keys[i], run_dir / f"{i:02d}_{param}={_slug(values[i])}.ipynb")
              for i in todo]
    try:  # in order here; on a cluster each point a Ray task (`sweep_points`)
        for finished in run_points(ex, ctx, points, _run_point):
            slots[todo[finished.index]] = finished.value
            bar.update(1)
        for attempt in range(1, retry_invalid + 1):
            again = [i for i in todo if slots[i] is not None and not slots[i]["valid"]]
            if not again:
                break
            print(f"workbench sweep: {len(again)} INVALID point(s) run again (retry "
                  f"{attempt} of {retry_invalid})", file=sys.stderr, flush=True)
            retry = [(values[i], keys[i], run_dir / f"{i:02d}_{param}={_slug(values[i])}"
                      f"_retry{attempt}.ipynb") for i in again]
            for finished in run_points(ex, ctx, retry, _run_point):
                slots[again[finished.index]] = finished.value
    finally:
        bar.close()
        rows = [r for r in slots if r is not None]
        failed = len(rows) < len(values) or any(r["status"] == "FAILED" for r in rows)
        from workbench.notebook_specs import sweep_metrics
        from workbench.sweep_report import report

        for r in rows:
            r["results_dir"], r["parent_run_id"] = str(folder), parent
        try:
            report(store, parent, nb, param, [r["value"] for r in rows], fixed, rows, folder,
                   sweep_metrics(nb))
        except Exception as e:  # noqa: BLE001 - the points are logged; the parent still ends
            print(f"workbench sweep: the sweep's report was not written: "
                  f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        store.finish(parent, failed=failed)
    return rows


def _run_point(ctx: dict[str, Any], value: Any, key: str, out: Path) -> dict[str, Any]:
    """Execute the notebook for one value inside its own child run."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    from workbench.experiments.labels import value_label
    from workbench.harness.validity import CpuShare, Validity, disturbed_line
    from workbench.tracking.param_keys import notebook_params

    store, param, declared = ctx["store"], ctx["param"], ctx["declared"]
    name = value_label(param, value, ctx.get("values", ()))  # "budget=64", as `workbench run`
    tags = {"kind": "sweep-point", "notebook": str(ctx["nb"]), "sweep_param": param,
            "sweep_value": key, "value": key, "output_path": str(out),
            # the sweep process (on a cluster: the driver, not the node's worker)
            "sweep_pid": str(ctx.get("owner_pid", os.getpid())),
            "sweep_host": ctx.get("owner_host", socket.gethostname()),
            **ctx.get("tags", {})}  # where it runs (`sweep_points`)
    run_id = store.create_run(name, parent_id=ctx["parent"], tags=tags)
    chosen = {param: value, **ctx["fixed"]}
    defaults = {k: v for k, v in declared.items() if k not in INJECTED}
    store.log_params(run_id, notebook_params({**defaults, **chosen}, swept=param))
    injected = {"mlflow_parent_run_id": run_id, "mlflow_uri": store.uri,
                "mlflow_experiment": store.client.get_experiment(store.experiment_id).name}
    params = {**chosen, **{k: v for k, v in injected.items() if k in declared}}
    error: str | None = None
    detail = ""
    share = CpuShare()
    try:
        with ctx["cpu_watch"].measure() as share:  # filled when the block ends, errors too
            papermill.execute_notebook(str(ctx["nb"]), str(out), parameters=params,
                                       kernel_name=ctx["kernel_name"],
                                       language=ctx.get("language"), progress_bar=False,
                                       cwd=str(ctx["nb"].parent),
                                       kernel_manager_class=_ipc_kernel_manager())
    except PapermillExecutionError as e:
        error = f"{e.ename}: {e.evalue} (cell {e.exec_count})"
        detail = _ANSI.sub("", str(e))
    except KeyboardInterrupt:
        _log_notebook(store, run_id, out)
        store.set_tags(run_id, {"error": "KeyboardInterrupt"})
        store.client.set_terminated(run_id, status="KILLED")
        raise
    except Exception as e:  # noqa: BLE001 - a failed point is recorded, the sweep goes on
        error = f"{type(e).__name__}: {e}"
        detail = traceback.format_exc()
    _log_notebook(store, run_id, out)
    if error is not None:
        store.set_tags(run_id, {"error": error[:5000]})
        store.log_files(run_id, {"error.txt": detail or error})
    validity = Validity()
    validity.judge_cpu(share.others, ctx["max_other_cpu_share"])
    store.log_validity(run_id, validity.valid, validity.reasons, validity.other_cpu_share,
                       validity.max_other_cpu_share)
    if validity.disturbed:
        print(disturbed_line(f"sweep point {param}={key}", share.others,
                             ctx["max_other_cpu_share"]), file=sys.stderr, flush=True)
    store.finish(run_id, failed=error is not None)
    return {"value": value, "status": "FAILED" if error else "FINISHED",
            "output_path": str(out), "run_id": run_id, "error": error,
            "valid": validity.valid, "other_cpu_share": validity.other_cpu_share,
            "node": tags.get("node")}


def _copy_notebook(output: str | None, run_dir: Path) -> str | None:
    """A resumed point's executed notebook, copied from its earlier folder into this one."""
    import shutil

    if not output or not Path(output).is_file():
        return output
    dst = run_dir / Path(output).name
    if not dst.exists():
        shutil.copyfile(output, dst)
    return str(dst)


def _log_notebook(store: Any, run_id: str, out: Path) -> None:
    if out.is_file():
        store.log_artifact(run_id, out)


def _latest_parent(store: Any, nb: Path, param: str) -> str | None:
    runs = store.client.search_runs([store.experiment_id], filter_string="tags.kind = 'sweep'",
                                    order_by=["attributes.start_time DESC"], max_results=1000)
    for r in runs:
        tags = r.data.tags
        if tags.get("notebook") == str(nb) and tags.get("sweep_param") == param:
            return str(r.info.run_id)
    return None


def mark_killed(store: Any, parent: str) -> list[str]:
    """Mark KILLED the children of `parent` still RUNNING although the sweep process that ran
    them is gone (SIGKILL, a crash, a closed laptop): MLflow never heard of their end. A
    point whose process (tags sweep_pid, sweep_host) is alive on this host is left alone.
    Returns one line per run marked (or left)."""
    runs = store.client.search_runs([store.experiment_id],
                                    filter_string=f"tags.`{PARENT_TAG}` = '{parent}'",
                                    max_results=5000)
    lines: list[str] = []
    for r in runs:
        if r.info.status != "RUNNING":
            continue
        tags, run_id = r.data.tags, r.info.run_id
        what = f"{tags.get('sweep_param', '?')}={tags.get('sweep_value', '?')} (run {run_id})"
        pid = tags.get("sweep_pid", "")
        if (tags.get("sweep_host") == socket.gethostname() and pid.isdigit()
                and int(pid) != os.getpid() and _alive(int(pid))):
            lines.append(f"point {what} is still RUNNING in process {pid}; left as it is")
            continue
        store.set_tags(run_id, {"error": "killed: the sweep process ended before this point "
                                         "did (found RUNNING on --resume)"})
        store.client.set_terminated(run_id, status="KILLED")
        lines.append(f"point {what} was left RUNNING by an interrupted sweep: marked KILLED; "
                     "it runs again")
    return lines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _finished_points(store: Any, parent: str) -> dict[str, tuple[str, str | None]]:
    """{value key: (run id, output path)} of the FINISHED children of `parent` that were not
    marked invalid (tag run_valid=false: disturbed points run again)."""
    runs = store.client.search_runs([store.experiment_id],
                                    filter_string=f"tags.`{PARENT_TAG}` = '{parent}'",
                                    max_results=5000)
    return {r.data.tags["sweep_value"]: (r.info.run_id, r.data.tags.get("output_path"))
            for r in runs if r.info.status == "FINISHED" and "sweep_value" in r.data.tags
            and r.data.tags.get("run_valid") != "false"}


# --------------------------------------------------------------------------- command line
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
    from workbench.sweep_report import SUMMARY_MD, links
    from workbench.tracking.mlflow_store import tracking_uri

    folder = Path(rows[0]["results_dir"])
    summary = folder / SUMMARY_MD  # absent only when the report failed (a line said so)
    print(summary.read_text().rstrip("\n") if summary.is_file() else summary_table(rows, param))
    for line in links(tracking_uri(_absolute_uri(uri)), rows[0]["parent_run_id"]):
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
