"""Prefill/decode disaggregation in the simulator: the prefill leg (max_tokens 1) on a prefill
instance, its blocks held until the decode instance has read the KV over the prefill
instance's link (bytes / bandwidth + latency, one transfer at a time), the decode leg with
those tokens computed; TTFT = prefill step + transfer + the decode's first step, by hand on a
toy analytic profile with no step noise."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.config import CacheConfig, SchedulerConfig
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.batch import BatchComposition
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.hardware import HardwareProfile
from workbench.sim.instance import SimInstance
from workbench.sim.model_shapes import ModelShape
from workbench.sim.pd import ConsumerConnector, ProducerConnector
from workbench.sim.simulator import simulate
from workbench.sim.target import make_cluster, run_simulated
from workbench.sim.transfer import KVLink

TOY = ModelShape(name="toy", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=1000)
GPU = HardwareProfile(name="toy-gpu", peak_flops=1e12, memory_bandwidth=1e11,
                      memory_bytes=1e9, link="toy", link_bandwidth=1e10)
KV_PER_TOKEN = 2 * 2 * 2 * 16 * 2  # K and V x 2 layers x 2 KV heads x 16 x bf16 = 256 B
LINK = KVLink(1e6, latency_s=1e-3)  # 1 MB/s: a 63-token prompt's KV takes 16.128 ms + 1 ms
BURST = ArrivalSpec(mode="poisson", rate=float("inf"))


def _cost() -> AnalyticCostModel:
    return AnalyticCostModel(TOY, GPU)


def _inst(name: str, connector: Any, cost: AnalyticCostModel, budget: int = 128) -> SimInstance:
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256)
    return SimInstance(name, sc, CacheConfig(block_size=16), 32, cost, connector=connector)


def _cluster(cost: AnalyticCostModel, num_decode: int = 1
             ) -> tuple[list[SimInstance], list[SimInstance]]:
    return ([_inst("prefill0", ProducerConnector(KV_PER_TOKEN), cost)],
            [_inst(f"decode{j}", ConsumerConnector(KV_PER_TOKEN), cost)
             for j in range(num_decode)])


def _wl(*reqs: tuple[str, int, int]) -> Workload:
    return Workload("w", 0, {}, tuple(BenchRequest(rid, list(range(base, base + 64)), out)
                                      for rid, base, out in reqs))


def test_ttft_is_the_prefill_step_plus_the_transfer_plus_the_decodes_first_step() -> None:
    cost = _cost()
    front, back = _cluster(cost)
    res = simulate(_wl(("r", 100, 3)), BURST, front, decode_instances=back, kv_link=LINK)
    (rec,) = res.records
    prefill = cost.step_time_s(BatchComposition(prefill_tokens=64, prefill_attn_pairs=2080,
                                                num_seqs=1, sampled_rows=1))
    transfer = 63 * 256 / 1e6 + 1e-3  # all but the last prompt token
    first = cost.step_time_s(BatchComposition(decode_tokens=1, decode_context_tokens=64,
                                              num_seqs=1, sampled_rows=1))
    second = cost.step_time_s(BatchComposition(decode_tokens=1, decode_context_tokens=65,
                                               num_seqs=1, sampled_rows=1))
    assert transfer == pytest.approx(0.017128)
    assert rec.ttft_s == pytest.approx(prefill + transfer + first)
    assert rec.chunk_times_s[1] - rec.chunk_times_s[0] == pytest.approx(second)
    assert rec.success and rec.output_tokens == 3 and rec.chunk_tokens == [1, 1, 1]
    assert rec.num_cached_tokens == 63  # read, not computed: vLLM's usage counts them
    assert rec.server_kv_transfer_s == pytest.approx(transfer)
    assert rec.server_kv_wait_s == pytest.approx(transfer)
    assert rec.server_kv_transfer_bytes == 63 * 256
    assert res.legs["r"]["prefill_end_s"] == pytest.approx(prefill)
    assert res.placement == {"r": ["prefill0", "decode0"]}
    assert res.roles == {"prefill0": "prefill", "decode0": "decode"}
    # the decode instance computed one token (the last prompt token) and decoded 2
    assert [row["prefill_tokens"] + row["decode_tokens"] for row in res.step_trace] == \
        [64, 1, 1, 1]
    c = res.counters
    assert c["workbench:kv_transfer_recv_bytes"] == 63 * 256
    assert c["workbench:kv_transfer_recv_tokens"] == 63
    assert c["workbench:kv_transfer_sends"] == 1
    assert c["workbench:kv_transfer_send_wait_time"] == pytest.approx(transfer)
    # the prefill instance held the leg's blocks until the read, then freed them
    assert not front[0].scheduler.sending
    assert front[0].scheduler.kv_cache_manager.usage == 0.0


def test_the_prefill_instance_holds_the_blocks_while_the_kv_crosses_the_link() -> None:
    cost = _cost()
    front, back = _cluster(cost)
    pool = front[0].scheduler.kv_cache_manager
    seen: list[tuple[int, float]] = []
    orig = back[0].complete_loads

    def spy(now: float) -> Any:
        due = back[0].next_load_s()
        if due is not None and due <= now:  # the read ends now: still held before it
            seen.append((len(front[0].scheduler.sending), pool.usage))
        return orig(now)

    back[0].complete_loads = spy  # type: ignore[method-assign]
    simulate(_wl(("r", 100, 2)), BURST, front, decode_instances=back, kv_link=LINK)
    assert seen[0][0] == 1 and seen[0][1] > 0  # held: 4 blocks of a 64-token prompt
    assert front[0].scheduler.kv_cache_manager.usage == 0.0


def test_two_legs_queue_on_one_prefill_instances_link() -> None:
    cost = _cost()
    front, back = _cluster(cost, num_decode=2)
    res = simulate(_wl(("a", 100, 2), ("b", 500, 2)), BURST, front, decode_instances=back,
                   kv_link=LINK)
    a, b = res.records
    x = 0.017128
    assert res.placement == {"a": ["prefill0", "decode0"], "b": ["prefill0", "decode1"]}
    assert a.server_kv_transfer_s == pytest.approx(x) == b.server_kv_transfer_s
    assert a.server_kv_wait_s == pytest.approx(x)
    assert b.server_kv_wait_s == pytest.approx(2 * x)  # waited for a's transfer
    assert b.ttft_s - a.ttft_s == pytest.approx(x)


def test_a_decode_prefix_hit_reads_only_the_rest() -> None:
    cost = _cost()
    front, back = _cluster(cost)
    res = simulate(_wl(("a", 100, 2), ("again", 100, 2)), ArrivalSpec(mode="closed",
                   concurrency=1), front, decode_instances=back, kv_link=LINK)
    first, again = res.records
    # the decode instance caches 3 full blocks (48 tokens); 63 - 48 = 15 tokens cross
    assert first.server_kv_transfer_bytes == 63 * 256
    assert again.server_kv_transfer_bytes == 15 * 256
    assert again.num_cached_tokens == 63
    assert res.counters["vllm:prefix_cache_hits"] == 96.0  # 48 on each side


def test_a_target_splits_num_workers_into_prefill_and_decode_instances() -> None:
    target = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM",
              "kv_transfer": {"link": "400gbe"}, "step_noise": 0}
    cluster, _ = make_cluster(target, {"num_workers": 4, "num_prefill": 1})
    assert [i.name for i in cluster.instances] == ["prefill0"]
    assert [i.name for i in cluster.decode_instances] == ["decode0", "decode1", "decode2"]
    assert cluster.spec.kv_transfer == KVLink(50e9, 0.0, "400gbe")
    tp2, _ = make_cluster(target, {"num_workers": 4, "num_prefill": 1,
                                   "tensor_parallel_size": 2})
    assert len(tp2.decode_instances) == 1  # 2 instances of 2 GPUs, one link per GPU
    assert tp2.spec.kv_transfer == KVLink(100e9, 0.0, "2 x 400gbe")
    wl = Workload("w", 0, {}, tuple(BenchRequest(f"r{i}", list(range(100 * i, 100 * i + 512)),
                                                 8) for i in range(4)))
    run = run_simulated(target, {"num_prefill": 1, "num_decode": 1}, wl, BURST)
    assert [r.output_tokens for r in run.records] == [8] * 4
    assert run.target["num_prefill"] == 1 and run.target["kv_transfer"]["name"] == "400gbe"
    # Llama-3-8B: 128 KiB per token; 511 tokens of each prompt cross
    assert run.server_delta["workbench:kv_transfer_recv_bytes"] == 4 * 511 * 131072


@pytest.mark.parametrize(("target", "config", "message"), [
    ({"num_prefill": 1, "num_decode": 1}, {}, "a prefill/decode split needs kv_transfer"),
    ({"num_prefill": 1, "kv_transfer": {"link": "400gbe"}}, {},
     r"num_prefill \(1\) and num_decode \(0\) must both be >= 1"),
    ({"kv_transfer": {"link": "ethernet"}, "num_prefill": 1, "num_decode": 1}, {},
     r"kv_transfer.link \('ethernet'\) must be one of"),
    ({"kv_transfer": {"link": "400gbe"}}, {"num_workers": 2, "num_prefill": 2},
     "num_prefill \\(2\\) leaves no decode instance"),
    ({}, {"num_workers": 3, "tensor_parallel_size": 2},
     r"num_workers \(3\) must be a multiple of the GPUs per instance"),
    ({"decode_policy": "prefix_aware"}, {}, r"decode_policy \('prefix_aware'\) must be one of"),
])
def test_refusals_name_the_field(target: dict[str, Any], config: dict[str, Any],
                                 message: str) -> None:
    base = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM"}
    with pytest.raises(ValueError, match=message):
        make_cluster({**base, **target}, config)
