"""tensor_parallel_size=2 with distributed_executor_backend="ray" on a two-node Ray cluster on
this machine (tests/cluster/conftest.py): rank 0 is this process, rank 1 a Ray actor in the
engine's placement group, talking over an authenticated TCP connection; gloo on CPU.

- greedy tokens equal TP=1 on the tiny Llama (fp32; chunked prefill, prefix hits, a pool
  small enough to preempt: test_tp_engine's engine knobs and prompts);
- close() leaves nothing behind: the actor is gone and the placement group removed.

The watchdog's check of the connection and the config's refusals are in test_tp_units.py (no
cluster needed). Skipped without Ray.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[cluster]'")

from tests.cluster.ray_nodes import connected  # noqa: E402
from tests.distributed.test_tp_engine import ENGINE, GREEDY, prompts_for  # noqa: E402
from workbench import LLM  # noqa: E402
from workbench.executor.ray_executor import RayExecutor, RayWorkerHandle  # noqa: E402
from workbench.testing import tiny_checkpoint  # noqa: E402
from workbench.testing.local_cluster import LocalCluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The package's cluster, this process connected to it."""
    with connected(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ray_tp") / "llama", arch="llama", seed=0)


def test_tp2_on_ray_gives_tp1_greedy_tokens(nodes: LocalCluster, model: Path) -> None:
    prompts = prompts_for(json.loads((model / "config.json").read_text())["vocab_size"])
    ref = LLM(model, **ENGINE)
    try:
        reference = [o.outputs[0].token_ids for o in ref.generate(prompts, GREEDY)]
    finally:
        ref.close()
    llm = LLM(model, tensor_parallel_size=2, distributed_executor_backend="ray", **ENGINE)
    executor = llm.engine.runner.executor
    try:
        assert isinstance(executor, RayExecutor)
        (handle,) = executor.procs
        assert isinstance(handle, RayWorkerHandle) and handle.is_alive()
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        ranks = llm.engine.runner.memory_per_rank()
    finally:
        llm.close()
    assert tokens == reference
    assert [r["tp_rank"] for r in ranks] == [0, 1]
    assert ranks[0]["kv_bytes"] == ranks[1]["kv_bytes"]  # one KV head each, same block count
    handle.join(timeout=30)
    assert not handle.is_alive() and handle.exitcode == 0  # "shutdown" read: a clean exit
    table = ray.util.placement_group_table(executor.placement_group)
    assert table["state"] == "REMOVED"
