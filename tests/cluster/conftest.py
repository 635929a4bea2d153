"""One two-node Ray cluster with its MLflow tracking server for every test in tests/cluster/
(`workbench.testing.local_cluster.LocalCluster`): started once when the first test asks for
it, killed with every process under it when the package's tests are done. A test that kills
the worker node gives it back (`restart_worker`) before it ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from workbench.testing.local_cluster import LocalCluster


@pytest.fixture(scope="package")
def cluster() -> Iterator[LocalCluster]:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[cluster]'")
    with LocalCluster.start() as c:
        yield c


@pytest.fixture(autouse=True)
def worker_node_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the cluster: a worker node again if the test killed it."""
    yield
    for value in request.node.funcargs.values():
        if isinstance(value, LocalCluster):
            value.restart_worker()
            return
