"""Two Ray nodes on this machine for the serving tests on Ray (tests/router/test_ray_pool.py,
tests/distributed/test_ray_tp.py): `workbench.testing.local_cluster.LocalCluster`'s nodes
("head" and "worker", 1 CPU and {"workbench_node": 1} each, every process killed at close)
without its MLflow tracking server, which these tests do not use.

    with connected_nodes(tmp) as c:   c.address, c.kill("worker"), node_names()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from workbench.testing.local_cluster import LocalCluster

RayNodes = LocalCluster


@contextlib.contextmanager
def connected_nodes(root: Path) -> Iterator[LocalCluster]:
    """The two nodes, this process connected to them (`ray.init`); all gone at the end."""
    import ray

    with LocalCluster.start(root, tracking=False) as c:
        ray.init(address=c.address, log_to_driver=False)
        try:
            yield c
        finally:
            ray.shutdown()


def node_names() -> dict[str, str]:
    """Node id -> node name ("head", "worker") of every node the connected Ray knows."""
    import ray

    return {n["NodeID"]: n["NodeName"] for n in ray.nodes()}
