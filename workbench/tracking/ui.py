"""`workbench ui`: the MLflow UI on this checkout's store, and the URLs that open a comparison.

    workbench ui [--port 5000] [--host 127.0.0.1] [--tracking-uri sqlite:///mlruns/mlflow.db]

runs `mlflow ui --backend-store-uri <store> --default-artifact-root <db folder>/artifacts
--host 127.0.0.1 --port 5000` (the store and artifact folder `Store` writes; an absolute
path, so starting it from another folder never creates an empty `mlflow.db` there) as a child
in its own session (setsid). On Ctrl-C (SIGINT) or SIGTERM (`kill`, a service manager, a
terminal closing: SIGHUP) it stops that whole process group (SIGTERM, then SIGKILL after
`STOP_TIMEOUT_S`); if `workbench ui` itself is killed (SIGKILL), the kernel sends MLflow
SIGTERM (Linux: PR_SET_PDEATHSIG), which MLflow forwards to its server. A port already in use
is one error line naming it, before MLflow starts.

`runs_url` opens an experiment's runs table on one parent's children sorted by the objective
(the "compare view": the children are the values, named by their labels, the knob a param
column); `compare_url` opens MLflow's compare page (parallel coordinates, scatter: pick the
knob's param as x and the objective as y) on a list of runs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from urllib.parse import quote, urlencode

from workbench.harness.ports import check_port_free

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
STOP_TIMEOUT_S = 10.0


def base_url(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    return f"http://{host}:{port}"


def ui_command(uri: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> list[str]:
    """The argv of `mlflow ui` on the sqlite store `uri` (artifacts beside the database,
    as `tracking.mlflow_store` writes them). `ValueError` for a non-database URI."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        backend = f"sqlite:///{db}"
        artifacts = str(db.parent / "artifacts")
    elif "://" in uri and not uri.startswith(("http://", "https://", "file:")):
        backend, artifacts = uri, None  # another database (postgresql://, mysql://)
    else:
        raise ValueError(f"--tracking-uri ({uri!r}) must be a database store such as "
                         "sqlite:///mlruns/mlflow.db; a running `mlflow server` is opened in "
                         "the browser directly")
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", backend]
    if artifacts:
        argv += ["--default-artifact-root", artifacts]
    return argv + ["--host", host, "--port", str(port)]


def runs_url(base: str, experiment_id: str, parent_run_id: str | None = None,
             objective: str | None = None, ascending: bool = True) -> str:
    """The experiment's runs table: only `parent_run_id`'s children, sorted by the
    `objective` metric column (ascending for a metric to minimize)."""
    # The runs route, in the classic (machine learning) workflow: the bare experiment route
    # redirects a fresh browser to the GenAI overview and drops the filter (MLflow 3.17).
    query: dict[str, str] = {"workflowType": "machine_learning"}
    if parent_run_id:
        query["searchFilter"] = f"tags.mlflow.parentRunId = '{parent_run_id}'"
    if objective:
        query["orderByKey"] = f"metrics.`{objective}`"
        query["orderByAsc"] = "true" if ascending else "false"
    return f"{base}/#/experiments/{experiment_id}/runs?{urlencode(query, quote_via=quote)}"


def compare_url(base: str, experiment_id: str, run_ids: Sequence[str]) -> str:
    """MLflow's compare-runs page on `run_ids` (the route the UI's "Compare" button opens)."""
    runs = quote(json.dumps(sorted(run_ids), separators=(",", ":")))
    exps = quote(json.dumps([str(experiment_id)], separators=(",", ":")))
    return f"{base}/#/compare-runs?runs={runs}&experiments={exps}"


def artifact_url(base: str, experiment_id: str, run_id: str, path: str) -> str:
    """A run's Artifacts tab with `path` selected and rendered (markdown as a page)."""
    query = urlencode({"workflowType": "machine_learning"})
    return (f"{base}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/"
            f"{quote(path)}?{query}")


def run_artifact_url(uri: str, run_id: str, path: str, base: str | None = None) -> str:
    """`artifact_url` for a run in the store at `uri`."""
    from mlflow.tracking import MlflowClient

    exp = str(MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id)
    return artifact_url(base or base_url(), exp, run_id, path)


def experiment_urls(uri: str, parent_run_id: str, objective: str, ascending: bool = True,
                    base: str | None = None) -> tuple[str, str]:
    """(runs table URL, compare URL) of one experiment parent's children. The table is
    the parent's saved view with metric columns (its tag `runs_view`: `tracking.runs_view`)
    when it has one, else `runs_url`."""
    from mlflow.tracking import MlflowClient

    from workbench.tracking.runs_view import VIEW_TAG, view_url

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    exp = str(parent.info.experiment_id)
    kids = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{parent_run_id}'",
                              max_results=1000)
    base = base or base_url()
    key = parent.data.tags.get(VIEW_TAG)
    return (view_url(base, exp, key) if key else
            runs_url(base, exp, parent_run_id, objective, ascending),
            compare_url(base, exp, [r.info.run_id for r in kids]))


def stop_group(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM the child's process group, SIGKILL it when it has not ended in `timeout`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


PR_SET_PDEATHSIG = 1  # prctl(2)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # besides SIGINT (KeyboardInterrupt)


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGTERM the child when `parent_pid` dies (Linux;
    None elsewhere), and ends the child at once if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before the prctl
            os._exit(1)

    return preexec


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench ui",
        description="The MLflow UI on the workbench's store, bound to 127.0.0.1; Ctrl-C stops it.")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT)
    ap.add_argument("--host", default=DEFAULT_HOST,
                    help="the interface to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--tracking-uri", default=None,
                    help="the store (default: $MLFLOW_TRACKING_URI, else "
                         "sqlite:///mlruns/mlflow.db of this folder)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from workbench.tracking.mlflow_store import tracking_uri

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    argv_ui = ui_command(tracking_uri(args.tracking_uri), args.host, args.port)
    check_port_free(args.host, args.port, "workbench ui")
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in STOP_SIGNALS}
    try:
        print(f"workbench ui: {base_url(args.host, args.port)} (Ctrl-C stops it)", flush=True)
        proc = subprocess.Popen(argv_ui, start_new_session=True,  # setsid: its own group
                                preexec_fn=die_with_parent(os.getpid()))
        try:
            return proc.wait()
        except KeyboardInterrupt:
            stop_group(proc)
            print("workbench ui: stopped", flush=True)
            return 0
        finally:
            if proc.poll() is None:
                stop_group(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    raise SystemExit(main())
