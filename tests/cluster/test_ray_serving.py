"""`workbench router --executor ray` end to end: two replicas of a tiny checkpoint as Ray actors
on a two-node Ray cluster on this machine (tests/cluster/conftest.py: "head" and "worker", 1 CPU
each), the router app in this process.

Resources: each replica's bundle asks 0.5 CPU, so the SPREAD group puts one replica on each
node, and both fit on the head once the worker node is gone (a bundle of 1 CPU, the default
threads x TP, would leave the lost replica waiting for a node). The module's one router:

- greedy tokens through the router equal an in-process LLM's, replicas on different nodes;
- a disaggregated router's prefill and decode instances (two more actors, one per node)
  hand the KV over through the prefill instance's node address;
- the worker node killed while streams run on both replicas: every request still answered
  (the router's retry and mid-stream resume), the lost replica restarted by Ray on the head
  node, routed to again, its restart counted.

Skipped without Ray (`pip install -e '.[cluster]'`). Every step is bounded in time; the
cluster's processes are killed at the end.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[cluster]'")

from tests.cluster.ray_nodes import connected, node_names  # noqa: E402
from tests.router.serving import serve_router  # noqa: E402
from workbench import LLM, SamplingParams  # noqa: E402
from workbench.harness import prom  # noqa: E402
from workbench.models.tokenizer import load_tokenizer  # noqa: E402
from workbench.router.app import build_router_app  # noqa: E402
from workbench.router.config import RouterConfig  # noqa: E402
from workbench.router.disagg_pool import disagg_sides  # noqa: E402
from workbench.router.ray_pool import RayReplicaPool  # noqa: E402
from workbench.testing import tiny_checkpoint  # noqa: E402
from workbench.testing.local_cluster import LocalCluster  # noqa: E402

pytestmark = pytest.mark.slow
ENGINE = {"dtype": "float32", "max_model_len": 1024, "block_size": 16,
          "num_gpu_blocks_override": 256}
SERVE = ["--dtype", "float32", "--max-model-len", "1024", "--block-size", "16",
         "--num-gpu-blocks-override", "256", "--served-model-name", "tiny"]
PROMPTS = ["def parse_args(argv):\n    ", "The cluster has two nodes and", "x = [1, 2, 3]\n",
           "Routing requests to replicas"]
MAX_TOKENS = 600  # the streams cut by the node loss (greedy: a shorter answer is a prefix)
SHORT = 48
RESTART_TIMEOUT_S = 150.0  # Ray declares the node dead (~15 s), then the replica starts again


def body(prompt: str, max_tokens: int = SHORT) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}


def streamed_ids(url: str, prompt: str, started: threading.Semaphore) -> list[int]:
    """The stream's token ids; `started` released at its first event."""
    with httpx.stream("POST", url + "/v1/completions",
                      json={**body(prompt, MAX_TOKENS), "stream": True}, timeout=120,
                      trust_env=False) as r:
        assert r.status_code == 200
        lines = []
        for ln in r.iter_lines():
            if ln.startswith("data: "):
                if not lines:
                    started.release()
                lines.append(ln[6:])
    assert lines[-1] == "[DONE]"
    return [i for ch in map(json.loads, lines[:-1]) for c in ch["choices"]
            for i in c.get("token_ids") or []]


def replicas(url: str) -> list[dict[str, Any]]:
    return httpx.get(url + "/router/replicas", timeout=10, trust_env=False).json()["replicas"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ray_router") / "tiny", arch="llama", seed=0)


@pytest.fixture(scope="module")
def reference(model: Path) -> dict[str, list[int]]:
    """Greedy token ids of an in-process LLM, per prompt."""
    llm = LLM(model, **ENGINE)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    try:
        return {p: o.outputs[0].token_ids for p, o in zip(PROMPTS, llm.generate(PROMPTS, greedy),
                                                           strict=True)}
    finally:
        llm.close()


@pytest.fixture(scope="module")
def nodes(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The package's cluster, this process connected to it."""
    with connected(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def router(nodes: LocalCluster, model: Path) -> Iterator[tuple[str, RayReplicaPool]]:
    config = RouterConfig(num_replicas=2, policy="round_robin", health_interval_s=0.2,
                          executor="ray", address=nodes.address, replica_num_cpus=0.5)
    pool = RayReplicaPool(["--model", str(model), *SERVE, "--log-level", "warning"], 2,
                          num_cpus=config.replica_num_cpus, address=config.address,
                          ready_timeout_s=180)
    app = build_router_app(config, pool, load_tokenizer(model))
    with serve_router(app, pool) as (url, _, _):
        yield url, pool


def test_greedy_tokens_through_ray_replicas_equal_an_in_process_llm(
        router: tuple[str, RayReplicaPool], reference: dict[str, list[int]]) -> None:
    url, pool = router
    names = node_names()
    assert sorted(names[r.node] for r in pool.replicas) == ["head", "worker"]  # one per node
    for r in pool.replicas:
        host = r.base_url.removeprefix("http://").split(":")[0]
        assert host == ray.util.get_node_ip_address() != "127.0.0.1"  # the node's address
    for prompt in PROMPTS:
        got = httpx.post(url + "/v1/completions", json=body(prompt), timeout=120,
                         trust_env=False).json()["choices"][0]["token_ids"]
        assert got == reference[prompt][:SHORT]
    assert [r["requests_total"] for r in replicas(url)] == [2, 2]  # round robin: both used


def test_disaggregated_instances_on_two_nodes_hand_the_kv_over(
        nodes: LocalCluster, model: Path, reference: dict[str, list[int]]) -> None:
    """A prefill and a decode instance as Ray actors (0.5 CPU each: beside the router's
    two), one per node: the decode instance reads the prefill's KV from the side channel the
    prefill instance bound to its node's address."""
    config = RouterConfig(num_prefill=1, num_decode=1, health_interval_s=0.2, executor="ray",
                          address=nodes.address, replica_num_cpus=0.5)
    serve = ["--model", str(model), *SERVE, "--log-level", "warning"]
    roles, extra = disagg_sides(serve, 1, 1)
    pool = RayReplicaPool(serve, 2, num_cpus=0.5, address=nodes.address, roles=roles,
                          replica_args=extra, ready_timeout_s=180)
    app = build_router_app(config, pool, load_tokenizer(model))
    with serve_router(app, pool) as (url, _, _):
        names = node_names()
        assert sorted(names[r.node] for r in pool.replicas) == ["head", "worker"]
        prompt = PROMPTS[0]
        got = httpx.post(url + "/v1/completions", json=body(prompt), timeout=120,
                         trust_env=False).json()["choices"][0]["token_ids"]
        record = httpx.get(url + "/router/requests", timeout=10,
                           trust_env=False).json()["requests"][-1]
        sent, received = (prom.parse(httpx.get(r.base_url + "/metrics", timeout=10,
                                               trust_env=False).text)
                          for r in pool.replicas)
    assert got == reference[prompt][:SHORT]
    assert (record["prefill_outcome"], record["prefill_replicas"],
            record["decode_replicas"]) == ("ok", [0], [1])
    assert sent["workbench:kv_transfer_send_bytes_total"] == \
        received["workbench:kv_transfer_recv_bytes_total"] > 0


def test_a_lost_node_loses_no_request_and_its_replica_comes_back(
        nodes: LocalCluster, router: tuple[str, RayReplicaPool],
        reference: dict[str, list[int]]) -> None:
    url, pool = router
    names = node_names()
    lost = next(r for r in pool.replicas if names[r.node] == "worker")
    kept = next(r for r in pool.replicas if r is not lost)
    started = threading.Semaphore(0)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as ex:
        futures = {p: ex.submit(streamed_ids, url, p, started) for p in PROMPTS}
        for _ in PROMPTS:  # every stream has begun: two on each replica (round robin)
            assert started.acquire(timeout=60)
        # the lost replica holds its two streams; one of the kept replica's may already be
        # done on a loaded machine (seen in CI) without changing what this test checks
        assert lost.outstanding == 2
        nodes.kill("worker")
        results = {p: f.result(timeout=180) for p, f in futures.items()}
    assert results == reference  # resumed or restarted on the head's replica: same tokens
    # the lost replica's two streams are retried on the head's (on a loaded machine one may
    # have finished between the check above and the kill taking effect: 2 of 2 in quiet
    # runs, 0 seen once in CI beside a benchmark); nothing retried away from the kept one
    assert lost.retries_total <= 2 and kept.retries_total == 0
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while not (lost.alive and lost.restarts_total == 1):
        assert time.monotonic() < deadline, replicas(url)
        time.sleep(0.5)
    assert names[lost.node] == "head" == names[kept.node]  # rescheduled on the node left
    row = replicas(url)[lost.index]
    assert (row["alive"], row["restarts_total"], row["url"]) == (True, 1, lost.base_url)
    assert (lost.failures_total, kept.failures_total, kept.restarts_total) == (1, 0, 0)
    sent = lost.requests_total
    for prompt in PROMPTS[:2]:  # round robin: one of the two goes to the restarted replica
        got = httpx.post(url + "/v1/completions", json=body(prompt), timeout=120,
                         trust_env=False).json()["choices"][0]["token_ids"]
        assert got == reference[prompt][:SHORT]
    assert lost.requests_total == sent + 1
    flat = prom.parse(httpx.get(url + "/metrics", timeout=30, trust_env=False).text)
    assert flat[f'router_replica_restarts_total{{replica="{lost.index}"}}'] == 1
    assert flat[f'router_replica_restarts_total{{replica="{kept.index}"}}'] == 0
    assert flat[f'router_replica_up{{replica="{lost.index}"}}'] == 1
    assert flat["router_failed_requests_total"] == 0
    assert flat["router_resumed_streams_total"] + flat["router_restarted_requests_total"] == 2
