"""A `ClusterSpec` made into simulated instances with their KV connectors, and run.

    cluster = build_cluster(spec, make_instance, kv_bytes_per_token=131072, block_size=16)
    result = cluster.simulate(workload, arrival)

`make_instance(name, index, connector)` builds one `SimInstance` (the target's scheduler and
cache configs, pool, cost model, seeds); this module decides the instances' names, roles and
connectors:

    colocated       instance0 .. instanceN-1    a CPUTierConnector each with a host tier
    disaggregated   prefill0 .. prefillP-1      ProducerConnector (holds a finished leg's KV)
                    decode0 .. decodeD-1        ConsumerConnector (reads it over the link)

The KV bytes a token takes are the core's arithmetic (`core.kv_cache.utils.
kv_bytes_per_token`: 2 x layers x KV heads x head_dim x the KV dtype's bytes) on the cost
model's shape; the whole instance's KV moves (all tensor-parallel shards, over one link per
GPU: `ClusterSpec.kv_transfer` is already scaled by the GPUs per instance).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from workbench.core.kv_cache.utils import kv_bytes_per_token as core_kv_bytes_per_token
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import Workload
from workbench.sim.batch import CostModel
from workbench.sim.cluster import ClusterSpec
from workbench.sim.connectors import SimConnector
from workbench.sim.instance import SimInstance
from workbench.sim.pd import ConsumerConnector, ProducerConnector
from workbench.sim.simulator import SimResult, simulate
from workbench.sim.tiers import CPUTierConnector
from workbench.sim.transfer import LinkQueue

MakeInstance = Callable[[str, int, SimConnector | None], SimInstance]


@dataclass
class SimCluster:
    """The instances of one run: colocated (or prefill) ones and decode ones."""

    spec: ClusterSpec
    instances: list[SimInstance]
    decode_instances: list[SimInstance] = field(default_factory=list)

    @property
    def all_instances(self) -> list[SimInstance]:
        return self.instances + self.decode_instances

    def simulate(self, workload: Workload, arrival: ArrivalSpec) -> SimResult:
        s = self.spec
        return simulate(workload, arrival, self.instances, s.router_policy,
                        prefix_blocks=s.prefix_blocks, decode_instances=self.decode_instances,
                        decode_policy=s.decode_policy, kv_link=s.kv_transfer)


def build_cluster(spec: ClusterSpec, make_instance: MakeInstance,
                  kv_bytes_per_token: int | None, block_size: int) -> SimCluster:
    """The instances `spec` describes (`kv_bytes_per_token` is needed only with a
    connector: a split or a host tier)."""
    needs_kv = spec.disaggregated or spec.kv_offload_blocks > 0
    if needs_kv and kv_bytes_per_token is None:
        raise ValueError("the cost model gives no KV bytes per token (no model shape): a "
                         "prefill/decode split or a host tier cannot be priced")
    kvb = kv_bytes_per_token or 1
    if spec.disaggregated:
        front = [make_instance(f"prefill{i}", i, ProducerConnector(kvb))
                 for i in range(spec.num_prefill)]
        back = [make_instance(f"decode{j}", spec.num_prefill + j, ConsumerConnector(kvb))
                for j in range(spec.num_decode)]
        return SimCluster(spec, front, back)
    insts = []
    for i in range(spec.num_instances):
        conn: SimConnector | None = None
        if spec.kv_offload_blocks:
            assert spec.kv_offload_link is not None
            conn = CPUTierConnector(spec.kv_offload_blocks, block_size, kvb,
                                    LinkQueue(spec.kv_offload_link))
        insts.append(make_instance(f"instance{i}", i, conn))
    return SimCluster(spec, insts)


def kv_bytes_per_token(cost: CostModel) -> int | None:
    """KV bytes one token takes in the cost model's instance (all layers, K and V, every
    tensor-parallel shard), or None when the cost model has no shape."""
    from workbench.sim.cost_model import dtype_bytes
    from workbench.sim.model_shapes import ModelShape

    shape = getattr(cost, "shape", None)
    nbytes = getattr(cost, "kv_bytes", None)
    profile = getattr(cost, "profile", None)
    if (shape is None or nbytes is None) and isinstance(profile, Mapping):
        model = profile.get("model")
        if not isinstance(model, Mapping) or not isinstance(model.get("shape"), Mapping):
            return None
        shape = ModelShape(**model["shape"])
        nbytes = dtype_bytes(str((profile.get("engine") or {}).get("dtype") or "float32"))
    if not isinstance(shape, ModelShape) or not isinstance(nbytes, int):
        return None
    return core_kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                                   nbytes)
