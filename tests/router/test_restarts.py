"""A replica the pool restarts is routed to again (the health loop's `pool.recovered()`), with
no Ray and no servers: a scripted pool over fake replicas does what `RayReplicaPool` does
after Ray restarts an actor. Also, without a cluster: `--executor ray`'s config refusals and
the side channel a Ray replica binds (tests/cluster/test_ray_serving.py runs the real thing)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.router.fakes import FakeReplica, fake_transport
from workbench.config.named_models import bundled_checkpoint
from workbench.harness import prom
from workbench.models.tokenizer import load_tokenizer
from workbench.router.app import build_router_app
from workbench.router.config import RouterConfig
from workbench.router.disagg_pool import FLAG, disagg_sides
from workbench.router.pool import Replica, ReplicaPool
from workbench.router.ray_replica import with_side_channel_host

BODY = {"model": "m", "prompt": "hello there", "max_tokens": 3, "temperature": 0.0}


class RestartingPool(ReplicaPool):
    """URL replicas the pool watches: one in `gone` has failed (its actor died); one in
    `comeback` is back at that URL (the restarted actor's), as RayReplicaPool reports."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(urls=urls)
        self.gone: set[int] = set()
        self.comeback: dict[int, str] = {}

    def watches(self, replica: Replica) -> bool:
        return True

    def failure(self, replica: Replica) -> str | None:
        return "its Ray actor died (node lost)" if replica.index in self.gone else None

    def recovered(self) -> list[Replica]:
        back = []
        for r in self.replicas:
            if not r.alive and r.index in self.comeback:
                self.gone.discard(r.index)
                r.base_url = self.comeback.pop(r.index)
                r.restarts_total += 1
                r.failure, r.alive = None, True
                back.append(r)
        return back


def wait_for(client: TestClient, index: int, alive: bool) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        row = client.get("/router/replicas").json()["replicas"][index]
        if row["alive"] is alive:
            return row  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, row
        time.sleep(0.02)


def test_a_restarted_replica_is_routed_to_again_with_its_counters_kept() -> None:
    r0, r1, r0_again = FakeReplica("r0"), FakeReplica("r1"), FakeReplica("r2")
    pool = RestartingPool([r0.url, r1.url])
    config = RouterConfig(num_replicas=2, policy="round_robin", health_interval_s=0.02)
    app = build_router_app(config, pool, load_tokenizer(bundled_checkpoint()),
                           transport=fake_transport([r0, r1, r0_again]))
    with TestClient(app) as client:
        for _ in range(2):
            assert client.post("/v1/completions", json=BODY).status_code == 200
        pool.gone.add(0)
        row = wait_for(client, 0, alive=False)
        assert row["failure"] == "its Ray actor died (node lost)"
        assert client.post("/v1/completions", json=BODY).status_code == 200  # r1 alone
        pool.comeback[0] = r0_again.url
        row = wait_for(client, 0, alive=True)
        assert (row["url"], row["restarts_total"], row["failure"]) == (r0_again.url, 1, None)
        for _ in range(2):
            assert client.post("/v1/completions", json=BODY).status_code == 200
        flat = prom.parse(client.get("/metrics").text)
    assert [len(r.completions) for r in (r0, r1, r0_again)] == [1, 3, 1]
    assert {k: v for k, v in flat.items() if k.startswith("router_replica")} == {
        'router_replica_failures_total{replica="0"}': 1.0,
        'router_replica_failures_total{replica="1"}': 0.0,
        'router_replica_restarts_total{replica="0"}': 1.0,
        'router_replica_restarts_total{replica="1"}': 0.0,
        'router_replica_up{replica="0"}': 1.0,
        'router_replica_up{replica="1"}': 1.0}
    assert flat['router_requests_total{replica="0"}'] == 2  # both incarnations
    assert ReplicaPool(urls=[r0.url]).recovered() == []  # the local pool restarts nothing


def test_a_ray_replica_binds_its_p2p_side_channel_to_its_node() -> None:
    roles, extra = disagg_sides(["--model", "m"], 1, 1, {"kv_connector_extra_config": {
        "layerwise": True}})
    assert roles == ["prefill", "decode"]
    out = with_side_channel_host(["--model", "m", *extra[0]], "10.0.0.7")
    assert out[:2] == ["--model", "m"] and out[2] == FLAG
    assert json.loads(out[3]) == {
        "kv_connector": "P2pConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"layerwise": True, "side_channel_host": "10.0.0.7"}}
    mine = [FLAG, json.dumps({"kv_connector": "P2pConnector", "kv_connector_extra_config": {
        "side_channel_host": "0.0.0.0"}})]
    assert with_side_channel_host(mine, "10.0.0.7") == mine  # the user's host stays
    assert with_side_channel_host(["--model", "m"], "10.0.0.7") == ["--model", "m"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"executor": "rey"}, "executor ('rey') must be one of local, ray (did you mean 'ray'?)"),
    ({"address": "10.0.0.1:6379"}, "address ('10.0.0.1:6379') places replicas on a Ray "
                                   "cluster: it needs --executor ray"),
    ({"executor": "ray", "replica_num_cpus": 0}, "replica_num_cpus (0) must be a number > 0 "
                                                 "(CPUs each replica's placement bundle holds)"),
    ({"executor": "ray", "replica_resources": {"workbench_node": -1}},
     "replica_resources ({'workbench_node': -1}) must map resource names to numbers >= 0, "
     'e.g. {"workbench_node": 1} (a node per replica)'),
    ({"executor": "ray", "replica_resources": {"GPU": 1}},
     "replica_resources ({'GPU': 1}) holds CPU or GPU: give --replica-num-cpus (GPUs follow "
     "the engine's device and TP)"),
])
def test_executor_config_refusals(kwargs: dict[str, Any], message: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.router.config.ray_installed", lambda: True)
    with pytest.raises(ValueError) as e:
        RouterConfig(**kwargs)
    assert str(e.value) == message


def test_executor_ray_without_ray_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workbench.router.config.ray_installed", lambda: False)
    with pytest.raises(ValueError) as e:
        RouterConfig(executor="ray")
    assert str(e.value) == ("--executor ray needs Ray, which is not installed: "
                            "pip install -e '.[cluster]'")
    assert RouterConfig().executor == "local"  # the default needs nothing
