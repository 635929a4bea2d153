"""Which node a run executes on, as its MLflow tags say: inside a Ray task (or locally).

    ident = node_identity()        # cached per process: the preflight takes ~2 s
    ident.tags()  -> {"node": "gpu-node-3", "node_hostname": ..., "hardware_fingerprint": ...,
                      "ray_node_id": ..., "ray_worker_pid": ...}

`node` is the Ray node's name (`ray start --node-name`, by default its IP) on a cluster and
the hostname locally; `hardware_fingerprint` is `workbench preflight`'s on that node.
`use_node_threads` gives a run the torch threads of its share of the node (Ray sets
OMP_NUM_THREADS to the task's num_cpus, 1 by default). `in_cwd` runs a job in the driver's
working folder when the node has it (relative paths in templates resolve as they did there).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeIdentity:
    node: str  # the Ray node name, or the hostname without Ray
    hostname: str
    fingerprint: str
    preflight: dict[str, Any]  # `collect_preflight()` on that node
    ray_node_id: str | None = None
    node_cpus: float | None = None  # the node's CPU resource in Ray (`ray start --num-cpus`)

    def tags(self) -> dict[str, str]:
        tags = {"node": self.node, "node_hostname": self.hostname,
                "hardware_fingerprint": self.fingerprint}
        if self.ray_node_id is not None:
            tags.update(ray_node_id=self.ray_node_id, ray_worker_pid=str(os.getpid()))
        return tags


_PREFLIGHT: dict[str, Any] = {}


def node_preflight() -> dict[str, Any]:
    """`collect_preflight()` of this process's machine, collected once per process."""
    if not _PREFLIGHT:
        from workbench.platforms.preflight import collect_preflight

        _PREFLIGHT.update(collect_preflight())
    return dict(_PREFLIGHT)


def node_identity() -> NodeIdentity:
    """This process's node: the Ray node it runs on when inside a Ray worker, else the host."""
    preflight = node_preflight()
    host = str(preflight.get("hostname") or socket.gethostname())
    info = _ray_node()
    if info is None:
        return NodeIdentity(host, host, str(preflight["fingerprint"]), preflight)
    name = str(info.get("NodeName") or info.get("NodeManagerAddress") or host)
    cpus = (info.get("Resources") or {}).get("CPU")
    return NodeIdentity(name, host, str(preflight["fingerprint"]), preflight,
                        ray_node_id=str(info["NodeID"]),
                        node_cpus=None if cpus is None else float(cpus))


def _ray_node() -> dict[str, Any] | None:
    """The `ray.nodes()` entry of the node this Ray worker runs on; None outside Ray."""
    import sys

    ray = sys.modules.get("ray")  # never imported here: a Ray worker has it already
    if ray is None or not ray.is_initialized():
        return None
    node_id = ray.get_runtime_context().get_node_id()
    return next((n for n in ray.nodes() if n.get("NodeID") == node_id),
                {"NodeID": node_id})


def use_node_threads(ident: NodeIdentity, runs_per_node: int) -> int | None:
    """Torch intra-op threads = the node's Ray CPUs / runs_per_node (at least 1); also
    OMP_NUM_THREADS for the processes the run starts. None (nothing set) outside Ray."""
    if ident.node_cpus is None:
        return None
    threads = max(1, int(ident.node_cpus // runs_per_node))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    return threads


@contextlib.contextmanager
def in_cwd(path: str | None) -> Iterator[None]:
    """Run the block in `path` when this node has that folder; else where we are."""
    old = os.getcwd()
    if path and os.path.isdir(path):
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def probe_node() -> dict[str, Any]:
    """What the executor asks of each node before any run: its name and preflight."""
    ident = node_identity()
    return {"node": ident.node, "hostname": ident.hostname, "fingerprint": ident.fingerprint,
            "preflight": ident.preflight, "ray_node_id": ident.ray_node_id}
