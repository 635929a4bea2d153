"""The simulator's router: the real routing policies (workbench.core.routing, the classes
`workbench router` uses) over simulated instances; exact instance per request, the policy's
reasons counted, and the prefix-cache hits prefix-aware routing buys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.request import Request
from workbench.core.routing import PrefixAwarePolicy
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.router import policies as router_policies
from workbench.sampling_params import SamplingParams
from workbench.sim.batch import BatchComposition
from workbench.sim.instance import SimInstance
from workbench.sim.router import SimRouter
from workbench.sim.simulator import simulate
from workbench.sim.target import make_instances


class LinearCost:
    def step_time_s(self, batch: BatchComposition) -> float:
        return 1e-3 + 1e-4 * batch.num_tokens

    def describe(self) -> dict[str, Any]:
        return {"source": "test"}


@dataclass
class Loaded:
    num_unfinished: int = 0


def _req(rid: str, ids: list[int]) -> Request:
    return Request(rid, ids, SamplingParams(max_tokens=1))


A = list(range(1000, 1064))  # 64 tokens: 4 blocks of 16, group A's key
B = list(range(2000, 2064))
C = list(range(3000, 3064))


def test_the_router_and_the_simulator_share_one_policy_class() -> None:
    assert router_policies.PrefixAwarePolicy is PrefixAwarePolicy


def test_prefix_aware_picks_owner_new_key_no_key_and_load_bound_exactly() -> None:
    insts = [Loaded(), Loaded(), Loaded()]
    router = SimRouter(insts, "prefix_aware", block_size=16, prefix_blocks=4)
    picks = [router.pick(_req("a1", A + [1])),  # new key: all idle, none owns a key -> 0
             router.pick(_req("b1", B)),  # new key: 0 owns one key -> 1
             router.pick(_req("a2", A + [2, 3])),  # the same first 4 blocks: owner 0
             router.pick(_req("c1", C)),  # new key -> 2
             router.pick(_req("short", list(range(10))))]  # under one block: fallback -> 0
    assert picks == [0, 1, 0, 2, 0]
    insts[0].num_unfinished = 5  # > min 0 + max(2, 0.25 x mean 5/3): the owner is skipped
    assert router.pick(_req("a3", A)) == 1  # least outstanding, rotating past the last pick
    assert dict(router.decisions) == {"new_key": 3, "owner": 1, "no_key": 1, "load_bound": 1}


def test_round_robin_and_least_outstanding_rotate_as_the_real_router() -> None:
    insts = [Loaded(), Loaded(), Loaded()]
    rr = SimRouter(insts, "round_robin")
    assert [rr.pick(_req(f"r{i}", A)) for i in range(4)] == [0, 1, 2, 0]
    lo = SimRouter(insts, "least_outstanding")
    insts[1].num_unfinished = 1
    # ties rotate from the instance after the last pick (0, then 2), never always 0
    assert [lo.pick(_req(f"l{i}", A)) for i in range(3)] == [0, 2, 0]
    assert dict(lo.decisions) == {"least_outstanding": 3}


def test_refusals_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"router policy \('random'\) must be one of"):
        SimRouter([Loaded()], "random")
    with pytest.raises(ValueError, match=r"router prefix_blocks \(0\) must be an integer >= 1"):
        SimRouter([Loaded()], "prefix_aware", prefix_blocks=0)
    with pytest.raises(ValueError, match="at least one instance"):
        SimRouter([], "round_robin")


def _inst(name: str) -> SimInstance:
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256)
    return SimInstance(name, sc, CacheConfig(block_size=16), 32, LinearCost())


def test_prefix_aware_keeps_each_group_on_one_instance_and_hits_its_prefix() -> None:
    # groups in the order A A B B: round robin splits each pair, prefix-aware does not
    wl = Workload("w", 0, {}, tuple(
        BenchRequest(rid, prefix + list(range(5000 + 16 * i, 5016 + 16 * i)), 2)
        for i, (rid, prefix) in enumerate([("a0", A), ("a1", A), ("b0", B), ("b1", B)])))
    closed = ArrivalSpec(mode="closed", concurrency=1)
    rr = simulate(wl, closed, [_inst("i0"), _inst("i1")], "round_robin")
    pa = simulate(wl, closed, [_inst("i0"), _inst("i1")], "prefix_aware", prefix_blocks=4)
    assert rr.placement == {"a0": ["i0"], "a1": ["i1"], "b0": ["i0"], "b1": ["i1"]}
    assert pa.placement == {"a0": ["i0"], "a1": ["i0"], "b0": ["i1"], "b1": ["i1"]}
    # 80-token prompts: the 4 shared full blocks (64 tokens) are a hit on the owner
    assert [r.num_cached_tokens for r in rr.records] == [0, 0, 0, 0]
    assert [r.num_cached_tokens for r in pa.records] == [0, 64, 0, 64]
    assert pa.decisions == {"router": {"new_key": 2, "owner": 2}}
    assert pa.counters["vllm:prefix_cache_hits"] == 128.0
    # a hit prefills 16 tokens (2.6 ms) instead of 80 (9 ms)
    assert pa.records[1].ttft_s == pytest.approx(0.0026)
    assert rr.records[1].ttft_s == pytest.approx(0.009)


def test_a_target_routes_by_its_policy_and_knobs_override_the_target() -> None:
    target = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM",
              "num_instances": 2, "router_policy": "round_robin"}
    insts, _ = make_instances(target, {"num_instances": 3, "router_policy": "prefix_aware"})
    assert [i.name for i in insts] == ["instance0", "instance1", "instance2"]
    with pytest.raises(ValueError, match=r"prefix_blocks \('4'\) must be an integer >= 1"):
        make_instances({**target, "prefix_blocks": "4"}, {})
