"""The serving tests on Ray (test_ray_serving.py, test_ray_tp.py) drive the package's
two-node cluster (conftest.py: "head" and "worker", 1 CPU and {"workbench_node": 1} each)
from this process:

    with connected(cluster):   ray.* calls, node_names()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from workbench.testing.local_cluster import LocalCluster


@contextlib.contextmanager
def connected(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """This process connected to the cluster (`ray.init`) until the block ends."""
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()


def node_names() -> dict[str, str]:
    """Node id -> node name ("head", "worker") of every node the connected Ray knows."""
    import ray

    return {n["NodeID"]: n["NodeName"] for n in ray.nodes()}
