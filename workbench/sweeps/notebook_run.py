"""One sweep point: the notebook executed by papermill for one value, inside its own MLflow
child run (params, the executed notebook, the error, the point's validity).

The kernel talks to papermill over IPC sockets (`IpcKernelManager`), not TCP: no "running over
TCP without encryption" warning per point. When the notebook declares `mlflow_parent_run_id`,
`mlflow_uri` or `mlflow_experiment` in its `parameters` cell, they are injected (this point's
child run, the store, the experiment) so the notebook can log into the sweep; see
`workbench.analysis.notebook.publish`.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import traceback
import uuid
from pathlib import Path
from typing import Any

INJECTED = ("mlflow_parent_run_id", "mlflow_uri", "mlflow_experiment")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def absolute_uri(uri: str | None) -> str | None:
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
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class IpcKernelManager(AsyncKernelManager):
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


def run_point(ctx: dict[str, Any], value: Any, key: str, out: Path) -> dict[str, Any]:
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
            **ctx.get("tags", {})}  # where it runs (`sweeps.points`)
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


def _log_notebook(store: Any, run_id: str, out: Path) -> None:
    if out.is_file():
        store.log_artifact(run_id, out)
