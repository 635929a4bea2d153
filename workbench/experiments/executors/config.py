"""Where runs execute: the executor's config, its template block and its command-line flags.

    workbench run X.yaml   [--executor local|ray] [--address ADDR] [--num-cpus N]
                           [--num-gpus N] [--runs-per-node K] [--allow-mixed-hardware]
    workbench sweep NB ... [the same flags but --allow-mixed-hardware]

    template:  cluster: {num_cpus: 1, num_gpus: 1, runs_per_node: 1}   # optional

`local` (the default) runs each (value, repeat) or sweep point in this process, one after
the other. `ray` makes each one a Ray task on a cluster (`executors.ray_executor`) that asks
for `num_cpus`, `num_gpus` and 1/runs_per_node of the custom resource NODE_RESOURCE, which
every node offers once (`ray start --resources '{"workbench_node": 1}'`): with the default
runs_per_node 1 a measured run holds a whole node and two runs never share one. The flags
override the template's block. Nothing here imports Ray.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any

from workbench.errors import UserError, did_you_mean, is_int

EXECUTORS = ("local", "ray")
NODE_RESOURCE = "workbench_node"  # `ray start --resources '{"workbench_node": 1}'` per node
CLUSTER_KEYS = ("num_cpus", "num_gpus", "runs_per_node")  # the template's `cluster` block
CLUSTER_EXTRA = "pip install -e '.[cluster]'"  # Ray 2.60.0 (pyproject.toml)


@dataclass(frozen=True)
class ExecutorConfig:
    """How the runs of one `workbench run` / `workbench sweep` execute."""

    kind: str = "local"  # "local" | "ray"
    address: str | None = None  # ray: HOST:PORT of the head; None: RAY_ADDRESS or `ray start` here
    num_cpus: float = 1.0  # Ray CPUs a run asks for (its node's CPUs set its torch threads)
    num_gpus: float = 0.0  # Ray GPUs a run asks for (Ray sets CUDA_VISIBLE_DEVICES)
    runs_per_node: int = 1  # runs that may share one node at a time (1: a run holds a node)
    node_resource: str = NODE_RESOURCE  # the custom resource each node offers once
    max_attempts: int = 3  # tries per run when its node dies; then it is recorded FAILED
    allow_mixed_hardware: bool = False  # compare runs from nodes with other fingerprints

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise UserError(f"executor ({self.kind!r}) must be one of {', '.join(EXECUTORS)}"
                            f"{did_you_mean(self.kind, EXECUTORS)}")
        if self.kind == "local" and self.address is not None:
            raise UserError(f"address ({self.address!r}) names a Ray cluster: it needs "
                            "--executor ray")
        for name in ("num_cpus", "num_gpus"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    math.isfinite(v) and v >= 0):
                raise UserError(f"{name} ({v!r}) must be a number >= 0 (the Ray resources "
                                "one run asks for)")
        if not is_int(self.runs_per_node) or self.runs_per_node < 1:
            raise UserError(f"runs_per_node ({self.runs_per_node!r}) must be an integer >= 1 "
                            "(1: each run holds a whole node)")
        if not is_int(self.max_attempts) or self.max_attempts < 1:
            raise UserError(f"max_attempts ({self.max_attempts!r}) must be an integer >= 1")

    @property
    def node_share(self) -> float:
        """The amount of `node_resource` one run asks for."""
        return 1.0 / self.runs_per_node


def cluster_problems(spec: Any) -> list[str]:
    """The problems of a template's `cluster` block (one sentence each; [] when fine)."""
    if not isinstance(spec, dict):
        return [f"cluster must be a mapping {{num_cpus, num_gpus, runs_per_node}}, not {spec!r}"]
    out = [f"unknown cluster key {k!r}{did_you_mean(k, CLUSTER_KEYS)}; allowed: "
           f"{', '.join(CLUSTER_KEYS)}" for k in sorted(set(spec) - set(CLUSTER_KEYS), key=str)]
    try:
        ExecutorConfig("ray", **{k: v for k, v in spec.items() if k in CLUSTER_KEYS})
    except UserError as e:
        out.append(f"cluster.{e}")
    return out


def add_executor_args(ap: argparse.ArgumentParser, verdict: bool = True) -> None:
    """The executor flags of `workbench run` (`verdict`: with --allow-mixed-hardware and the
    template's `cluster` block) and `workbench sweep`."""
    src = "the template's cluster.{}, else " if verdict else ""
    g = ap.add_argument_group("where the runs execute (docs/cluster.md)")
    g.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: one run after another in this process (default); ray: each "
                        "run a Ray task on a cluster, one run per node")
    g.add_argument("--address", default=None, metavar="HOST:PORT",
                   help="the Ray head's address (default: $RAY_ADDRESS, else the cluster "
                        "`ray start` made on this machine; 'local': a one-node Ray here)")
    g.add_argument("--num-cpus", type=float, default=None, metavar="N",
                   help=f"Ray CPUs per run (default: {src.format('num_cpus')}1)")
    g.add_argument("--num-gpus", type=float, default=None, metavar="N",
                   help=f"Ray GPUs per run (default: {src.format('num_gpus')}0)")
    g.add_argument("--runs-per-node", type=int, default=None, metavar="K",
                   help=f"runs that may share a node (default: {src.format('runs_per_node')}"
                        "1: a run holds a whole node)")
    if verdict:
        g.add_argument("--allow-mixed-hardware", action="store_true",
                       help="compare runs measured on nodes whose hardware/software "
                            "fingerprints differ (refused by default)")


def executor_config(args: argparse.Namespace, cluster: dict[str, Any] | None = None
                    ) -> ExecutorConfig:
    """The config the flags ask for; a flag overrides the template's `cluster` block."""
    spec = dict(cluster or {})
    for key in CLUSTER_KEYS:
        flag = getattr(args, key, None)
        if flag is not None:
            spec[key] = flag
    if args.executor == "local" and args.address is None:
        spec = {}  # the block only matters on a cluster
    return ExecutorConfig(args.executor, address=args.address,
                          allow_mixed_hardware=bool(getattr(args, "allow_mixed_hardware",
                                                            False)), **spec)


SERVER_SCHEMES = ("http://", "https://", "databricks")


def check_tracking_uri(config: ExecutorConfig, uri: str | None) -> None:
    """On a cluster every node writes its runs itself: the store must be a tracking server
    they all reach (`mlflow server`), not a file on this machine. `UserError` otherwise."""
    if config.kind == "local" or config.address == "local":  # one machine: any store
        return
    given = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlruns/mlflow.db"
    if given.startswith(SERVER_SCHEMES):
        return
    where = "--tracking-uri" if uri else (
        "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the default store")
    raise UserError(f"tracking URI ({given!r}, {where}) must be an MLflow tracking server every "
                    "node can reach (--tracking-uri http://HOST:5000, `mlflow server`; "
                    "docs/cluster.md) with --executor ray: a local store is written by this "
                    "machine only")
