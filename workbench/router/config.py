"""RouterConfig: the router's own knobs (the replicas' engine knobs are `workbench serve` flags).

    workbench router --num-replicas 2 --policy prefix_aware --prefix-blocks 4 --port 8000 \\
        --model DIR [every `workbench serve` engine flag, passed to each replica]
    workbench router --num-workers 2 --tensor-parallel-size 2 ...   # 1 replica of TP=2

`--num-workers W` fixes the worker processes instead of the replicas: W / tensor_parallel_size
replicas, so "2 workers as 2 replicas or as one TP=2 engine" changes one knob
(tensor_parallel_size) at a fixed W, as experiments/tp_vs_replicas.yaml does.

Disaggregated prefill/decode (`disagg.py`): `num_prefill` P >= 1 and `num_decode` M >= 1
(both 0: colocated, the default). Then the replicas are P prefill + M decode, `num_replicas`
is set to P + M, and `num_workers` = (P + M) x tensor_parallel_size, so colocated and
disaggregated layouts compare at the same worker count. `prefill_policy` picks among the
prefill replicas, `decode_policy` among the decode ones; `policy` is then unused.

Where the replicas run (`executor`): "local" (default) = `workbench serve` processes on
127.0.0.1 (`pool.ReplicaPool`); "ray" = Ray actors on the nodes of the Ray cluster at
`address` (`ray_pool.RayReplicaPool`, the `cluster` extra), each replica's placement bundle
`replica_num_cpus` CPUs (default replica_threads x tensor_parallel_size) plus
`replica_resources` (e.g. {"workbench_node": 1}: one replica per node).

Each field is a flag of `workbench router` (`--num-replicas`, `--policy`, ...). `block_size`
defaults to the replicas' engine block size so the prefix key is the engine's block hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.parallel import CLUSTER_EXTRA, ray_installed
from workbench.errors import did_you_mean
from workbench.router.policies import POLICIES, RoutingPolicy, make_policy

DECODE_POLICIES = ("round_robin", "least_outstanding")  # a decode leg has no prefix to reuse
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class RouterConfig:
    num_replicas: int = 2  # independent `workbench serve` processes
    policy: str = "round_robin"  # round_robin | least_outstanding | prefix_aware
    prefix_blocks: int = 4  # k: full blocks of the prompt that key prefix_aware
    block_size: int = 16  # tokens per block of the key (the engine's block_size)
    load_bound_min: float = 2.0  # owner skipped when > min + max(this, frac x mean)
    load_bound_frac: float = 0.25
    replica_threads: int = 1  # intra-op threads per replica (OMP_NUM_THREADS)
    ready_timeout_s: float = 300.0  # per replica, from launch to a healthy /health
    health_interval_s: float = 1.0  # liveness check of every replica
    max_attempts: int | None = None  # tries per request; None: every live replica once
    tensor_parallel_size: int = 1  # of each replica's engine (its ranks are workers too)
    num_prefill: int = 0  # disaggregated: prefill replicas (0 with num_decode 0: colocated)
    num_decode: int = 0  # disaggregated: decode replicas
    prefill_policy: str = "prefix_aware"  # POLICIES, among the prefill replicas
    decode_policy: str = "least_outstanding"  # DECODE_POLICIES, among the decode replicas
    # disaggregated: pick the decode replica first and name its side channel in the prefill
    # request, so a layerwise prefill replica pushes the KV there while it prefills
    kv_push: bool = False
    executor: str = "local"  # local (processes on this machine) | ray (Ray actors, any node)
    address: str | None = None  # ray: the cluster's HOST:PORT, "auto", "local"; None: Ray's
    replica_num_cpus: float | None = None  # ray: CPUs per replica; None: threads x TP
    replica_resources: dict[str, float] | None = None  # ray: custom resources per replica

    def __post_init__(self) -> None:
        ints = {"num_replicas": self.num_replicas, "prefix_blocks": self.prefix_blocks,
                "block_size": self.block_size, "replica_threads": self.replica_threads,
                "tensor_parallel_size": self.tensor_parallel_size}
        for name, value in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
        if self.policy not in POLICIES:
            raise ValueError(f"policy ({self.policy!r}) must be one of {', '.join(POLICIES)}")
        for name, num in (("load_bound_min", self.load_bound_min),
                          ("load_bound_frac", self.load_bound_frac)):
            if not num >= 0:
                raise ValueError(f"{name} ({num!r}) must be >= 0")
        for name, num in (("ready_timeout_s", self.ready_timeout_s),
                          ("health_interval_s", self.health_interval_s)):
            if not num > 0:
                raise ValueError(f"{name} ({num!r}) must be > 0 seconds")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts ({self.max_attempts!r}) must be >= 1 or None")
        self._check_disaggregation()
        self._check_executor()

    def _check_executor(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor ({self.executor!r}) must be one of "
                             f"{', '.join(EXECUTORS)}{did_you_mean(self.executor, EXECUTORS)}")
        if self.executor != "ray":
            for name in ("address", "replica_num_cpus", "replica_resources"):
                value = getattr(self, name)
                if value is not None:
                    raise ValueError(f"{name} ({value!r}) places replicas on a Ray cluster: it "
                                     "needs --executor ray")
            return
        if not ray_installed():
            raise ValueError(f"--executor ray needs Ray, which is not installed: {CLUSTER_EXTRA}")
        cpus = self.replica_num_cpus
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)
                                 or not cpus > 0):
            raise ValueError(f"replica_num_cpus ({cpus!r}) must be a number > 0 (CPUs each "
                             "replica's placement bundle holds)")
        res = self.replica_resources
        if res is not None and (not isinstance(res, dict) or not all(
                isinstance(k, str) and k and not isinstance(v, bool)
                and isinstance(v, int | float) and v >= 0 for k, v in res.items())):
            raise ValueError(f"replica_resources ({res!r}) must map resource names to numbers "
                             '>= 0, e.g. {"workbench_node": 1} (a node per replica)')
        if res and ({"CPU", "GPU"} & set(res)):
            raise ValueError(f"replica_resources ({res!r}) holds CPU or GPU: give "
                             "--replica-num-cpus (GPUs follow the engine's device and TP)")

    def _check_disaggregation(self) -> None:
        for name, value in (("num_prefill", self.num_prefill), ("num_decode", self.num_decode)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 0 (0 with the other "
                                 "0: colocated replicas)")
        if (self.num_prefill == 0) != (self.num_decode == 0):
            raise ValueError(
                f"num_prefill ({self.num_prefill}) and num_decode ({self.num_decode}) must both "
                "be >= 1 (disaggregated prefill/decode) or both 0 (colocated replicas)")
        if self.prefill_policy not in POLICIES:
            raise ValueError(f"prefill_policy ({self.prefill_policy!r}) must be one of "
                             f"{', '.join(POLICIES)}")
        if self.decode_policy not in DECODE_POLICIES:
            raise ValueError(f"decode_policy ({self.decode_policy!r}) must be one of "
                             f"{', '.join(DECODE_POLICIES)}")
        if not isinstance(self.kv_push, bool):
            raise ValueError(f"kv_push ({self.kv_push!r}) must be true or false")
        if self.kv_push and not self.disaggregated:
            raise ValueError("kv_push needs disaggregated prefill/decode (num_prefill and "
                             "num_decode >= 1)")
        if self.disaggregated:  # the replica count follows the two sides
            object.__setattr__(self, "num_replicas", self.num_prefill + self.num_decode)

    @property
    def disaggregated(self) -> bool:
        """True with prefill and decode replicas (num_prefill, num_decode >= 1)."""
        return self.num_prefill > 0

    @property
    def num_workers(self) -> int:
        """Worker processes: replicas (P + M when disaggregated) x tensor-parallel ranks each."""
        return self.num_replicas * self.tensor_parallel_size

    @staticmethod
    def replicas_for_workers(num_workers: int, tensor_parallel_size: int) -> int:
        """num_workers / tensor_parallel_size, or a ValueError naming both."""
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers ({num_workers!r}) must be an integer >= 1")
        if num_workers % tensor_parallel_size:
            raise ValueError(
                f"num_workers ({num_workers}) must be a multiple of tensor_parallel_size "
                f"({tensor_parallel_size}): each replica runs tensor_parallel_size workers")
        return num_workers // tensor_parallel_size

    def make_policy(self, name: str | None = None) -> RoutingPolicy:
        """The policy `name` (default: `policy`) with this config's prefix knobs."""
        return make_policy(name or self.policy, self.block_size, self.prefix_blocks,
                           self.load_bound_min, self.load_bound_frac)
