"""A host-memory KV tier in the simulator (the OffloadingConnector's scheduler side on the real
HostTier): blocks written through after each step, kept LRU, a later prefix the device cache
evicted loaded at bytes / bandwidth instead of recomputed; tier hits counted exactly."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.config import CacheConfig, SchedulerConfig
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.batch import BatchComposition
from workbench.sim.instance import SimInstance
from workbench.sim.simulator import simulate
from workbench.sim.target import make_cluster
from workbench.sim.tiers import CPUTierConnector
from workbench.sim.transfer import KVLink, LinkQueue

KV_PER_TOKEN = 1000  # bytes: a 16-token block is 16 kB
CLOSED = ArrivalSpec(mode="closed", concurrency=1)


class LinearCost:
    def step_time_s(self, batch: BatchComposition) -> float:
        return 1e-3 + 1e-4 * batch.num_tokens

    def describe(self) -> dict[str, Any]:
        return {"source": "test"}


def _inst(tier_blocks: int | None, bandwidth: float = 1e6) -> SimInstance:
    sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=128)
    conn = None if tier_blocks is None else CPUTierConnector(
        tier_blocks, 16, KV_PER_TOKEN, LinkQueue(KVLink(bandwidth)))
    # 5 blocks: 4 usable (the null block aside), exactly one 64-token prompt
    return SimInstance("i0", sc, CacheConfig(block_size=16), 5, LinearCost(), connector=conn)


# a, then b (evicts all of a's blocks from the device), then a's prompt again
WL = Workload("w", 0, {}, (BenchRequest("a", list(range(100, 164)), 1),
                           BenchRequest("b", list(range(500, 564)), 1),
                           BenchRequest("a2", list(range(100, 164)), 1)))


def test_an_evicted_prefix_is_loaded_from_the_tier_at_bytes_over_bandwidth() -> None:
    res = simulate(WL, CLOSED, [_inst(tier_blocks=8)])
    a, b, a2 = res.records
    # 3 full blocks (the last token is always computed): 48 tokens x 1000 B at 1 MB/s
    assert a2.num_cached_tokens == 48
    assert a2.ttft_s == pytest.approx(0.048 + 1e-3 + 16e-4)
    assert a.ttft_s == pytest.approx(1e-3 + 64e-4) == b.ttft_s
    c = res.counters
    assert c["vllm:prefix_cache_hits"] == 0.0  # the device cache lost a's blocks to b
    assert c["vllm:external_prefix_cache_queries"] == 192.0  # 64 tokens looked up x 3
    assert c["vllm:external_prefix_cache_hits"] == 48.0
    assert c["workbench:kv_offload_host_hits"] == 48.0
    assert c["vllm:kv_offload_load_bytes"] == 48_000.0
    assert c["vllm:kv_offload_load_time"] == pytest.approx(0.048)
    # written through: a's 4 blocks and b's 4; a2's were all there already
    assert c["vllm:kv_offload_store_bytes"] == 8 * 16 * KV_PER_TOKEN
    assert [row["prefill_tokens"] for row in res.step_trace] == [64, 64, 16]


def test_the_load_is_priced_by_the_link() -> None:
    res = simulate(WL, CLOSED, [_inst(tier_blocks=8, bandwidth=1e9)])
    assert res.records[2].ttft_s == pytest.approx(48e-6 + 1e-3 + 16e-4)


def test_a_tier_too_small_evicts_lru_and_the_prefix_is_recomputed() -> None:
    small = simulate(WL, CLOSED, [_inst(tier_blocks=4)])  # b's 4 stores evict a's 4
    none = simulate(WL, CLOSED, [_inst(tier_blocks=None)])
    for res in (small, none):
        assert res.records[2].num_cached_tokens == 0
        assert res.records[2].ttft_s == pytest.approx(1e-3 + 64e-4)
    assert small.counters["vllm:external_prefix_cache_hits"] == 0.0
    assert "vllm:external_prefix_cache_hits" not in none.counters


def test_the_engine_knob_sizes_the_tier_and_the_target_names_its_link() -> None:
    target = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM",
              "kv_offload": {"link": "pcie5-x16"}}
    knob = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 4 << 30}}
    cluster, _ = make_cluster(target, {"kv_transfer_config": knob})
    conn = cluster.instances[0].connector
    assert isinstance(conn, CPUTierConnector)
    assert conn.host.num_slots == (4 << 30) // (131072 * 16)  # 2048 blocks of 2 MiB
    assert conn.link.link.name == "pcie5-x16"
    off, _ = make_cluster(target, {"kv_transfer_config": None})
    assert off.instances[0].connector is None
    sized, _ = make_cluster({**target, "kv_offload": {"link": "pcie5-x16",
                                                      "num_cpu_blocks": 100}}, {})
    tier = sized.instances[0].connector
    assert isinstance(tier, CPUTierConnector) and tier.host.num_slots == 100


@pytest.mark.parametrize(("target", "config", "message"), [
    ({}, {"kv_transfer_config": {"kv_connector": "OffloadingConnector",
                                 "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}},
     "a host KV tier needs kv_offload.link"),
    ({"kv_offload": {"link": "pcie5-x16"}},
     {"kv_transfer_config": {"kv_connector": "P2pConnector"}},
     "models the OffloadingConnector only"),
    ({"kv_offload": {"link": "pcie5-x16", "blocks": 3}}, {},
     "kv_offload.blocks is not a kv_offload key"),
    ({"kv_offload": {"link": "pcie5-x16", "num_cpu_blocks": 10},
      "kv_transfer": {"link": "400gbe"}, "num_prefill": 1, "num_decode": 1}, {},
     "a host KV tier with a prefill/decode split is not modelled"),
])
def test_refusals_name_the_field(target: dict[str, Any], config: dict[str, Any],
                                 message: str) -> None:
    base = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM"}
    with pytest.raises(ValueError, match=message):
        make_cluster({**base, **target}, config)
