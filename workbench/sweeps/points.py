"""A sweep's points on an executor (`workbench sweep ... --executor local|ray`).

    local: each point is `notebook_run.run_point` here, one after the other (as before executors)
    ray:   each point is `point_on_node` in a Ray task holding one node: papermill runs the
           notebook there (the checkout must sit at the same path on every node), the point's
           child run is logged to the tracking server from there, and the executed notebook
           comes back to this machine's results folder (its `output_path` tag follows it)

Every point's run is tagged with where it ran (node, node_hostname, hardware_fingerprint;
on Ray also ray_node_id) and its try (`executor_attempt`); sweep_pid / sweep_host stay the
sweep process's, so `--resume` (`resume.mark_killed`) still knows whether a RUNNING point's
owner is alive. A point whose node died is marked KILLED and runs again on another node.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.experiments.executors.base import ATTEMPT_TAG, Done, Executor, mark_lost


@dataclass(frozen=True)
class PointJob:
    """What a node needs to run one sweep point; pickled into its Ray task."""

    notebook: str  # absolute path, the same on every node
    param: str
    value: Any
    key: str  # the value's canonical JSON (`report.value_key`)
    fixed: dict[str, Any]
    declared: dict[str, Any]  # the notebook's parameters cell
    values: list[Any]  # every swept value (for the run's label)
    kernel_name: str | None
    threshold: float  # max_other_cpu_share
    uri: str
    experiment: str
    parent: str
    out_name: str  # the executed notebook's file name
    owner_pid: int  # the sweep process (`mark_killed` on --resume)
    owner_host: str
    runs_per_node: int
    run_point: Callable[..., dict[str, Any]]  # `notebook_run.run_point` (pickled by reference)
    language: str | None = None  # --kernel's language for a notebook without a kernelspec


def point_on_node(job: PointJob, attempt: str) -> dict[str, Any]:
    """One sweep point inside a Ray task; its row, with the executed notebook's bytes
    under "notebook_bytes"."""
    from workbench.experiments.executors.node import node_identity, use_node_threads
    from workbench.harness.validity import default_cpu_watch
    from workbench.tracking.mlflow_store import Store

    ident = node_identity()
    use_node_threads(ident, job.runs_per_node)  # OMP_NUM_THREADS for the kernel too
    ctx = {"store": Store(job.experiment, job.uri), "parent": job.parent,
           "nb": Path(job.notebook), "param": job.param, "fixed": job.fixed,
           "declared": job.declared, "kernel_name": job.kernel_name,
           "language": job.language, "values": job.values,
           "max_other_cpu_share": job.threshold, "cpu_watch": default_cpu_watch(),
           "owner_pid": job.owner_pid, "owner_host": job.owner_host,
           "tags": {"executor": "ray", ATTEMPT_TAG: attempt, **ident.tags()}}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / job.out_name
        row = job.run_point(ctx, job.value, job.key, out)
        row["notebook_bytes"] = out.read_bytes() if out.is_file() else None
    return row


def run_points(executor: Executor, ctx: dict[str, Any],
               points: Sequence[tuple[Any, str, Path]],
               run_point: Callable[..., dict[str, Any]]) -> Iterator[Done[dict[str, Any]]]:
    """Each (value, key, output path) as a point on `executor`; yields each `Done` (its
    index into `points`, its row) as it finishes. `run_point`: the sweep's `run_point`
    (handed in: this module does not import the sweep that imports it)."""
    from workbench.experiments.executors.node import node_identity

    store = ctx["store"]
    local = executor.kind == "local"
    names = [f"{ctx['param']}={key}" for _, key, _ in points]

    def here(i: int, attempt: str) -> dict[str, Any]:
        value, key, out = points[i]
        tags = {"executor": "local", ATTEMPT_TAG: attempt, **node_identity().tags()}
        return run_point({**ctx, "tags": tags}, value, key, out)

    payloads: list[Any] = list(range(len(points))) if local else [
        PointJob(str(ctx["nb"]), ctx["param"], value, key, ctx["fixed"], ctx["declared"],
                 list(ctx["values"]), ctx["kernel_name"], ctx["max_other_cpu_share"],
                 store.uri, store.client.get_experiment(store.experiment_id).name,
                 ctx["parent"], out.name, os.getpid(), socket.gethostname(),
                 executor.config.runs_per_node, run_point, ctx.get("language"))
        for value, key, out in points]
    killed: dict[int, str] = {}

    def lost(i: int, attempt: str, reason: str) -> None:
        mark_lost(store, attempt, reason, killed, i, "sweep", f"point {names[i]}",
                  "it runs again")

    def give_up(i: int, reason: str) -> dict[str, Any]:
        return {"value": points[i][0], "status": "FAILED", "output_path": None,
                "run_id": killed.get(i), "error": reason, "valid": True,
                "other_cpu_share": None, "node": None}

    for done in executor.run(here if local else point_on_node, payloads,
                             what=names.__getitem__, lost=lost, give_up=give_up):
        if not local:
            _bring_home(store, done.value, points[done.index][2])
            _say_disturbed(done.value, names[done.index], ctx["max_other_cpu_share"])
        yield done


def _say_disturbed(row: dict[str, Any], name: str, threshold: float) -> None:
    """The line `run_point` printed on the node's console, printed here."""
    share = row.get("other_cpu_share")
    if not row.get("valid", True) and share is not None:
        from workbench.harness.validity import disturbed_line

        print(disturbed_line(f"sweep point {name}", share, threshold), file=sys.stderr,
              flush=True)


def _bring_home(store: Any, row: dict[str, Any], out: Path) -> None:
    """A node's row: its executed notebook written to `out` here, its path in the row and
    in the run's `output_path` tag."""
    data = row.pop("notebook_bytes", None)
    if data is None:
        return
    out.write_bytes(data)
    row["output_path"] = str(out)
    if row.get("run_id"):
        store.set_tags(row["run_id"], {"output_path": str(out)})
