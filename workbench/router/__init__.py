"""Independent replicas behind a prefix-aware router (`workbench router`), with failure retry.

    client ──HTTP──> router (127.0.0.1:8000) ──policy──> replica 0  workbench serve :P0
                     │  prompts.py  validate, tokenize        replica 1  workbench serve :P1
                     │  policies.py round_robin | least_outstanding | prefix_aware
                     │  forward.py  forward; on a broken replica: mark dead, retry elsewhere
                     │  relay.py    a broken stream resumed: prompt + tokens so far
                     │  metrics.py  router counters + every replica's /metrics (+ aggregates)
                     └  pool.py     N processes, each its own process group, 1 thread each

    config.py   RouterConfig (the router's knobs)      app.py   the FastAPI app and lifespan
    cli.py      `workbench router ...`

On a Ray cluster (`--executor ray`, the `cluster` extra; docs/cluster_serving.md):
    ray_pool.py     RayReplicaPool: the replicas as Ray actors spread over the nodes (one
                    placement group); a lost one restarted by Ray and routed to again
    ray_replica.py  the actor: `workbench serve`'s app in its process, on its node's IP

Disaggregated prefill/decode (`--num-prefill P --num-decode M`, `workbench disagg`):
    disagg.py       DisaggRouter: a prefill leg on a prefill replica, then the decode leg
                    (vLLM's proxy protocol, kv_transfer_params), fallback, records, timings
    disagg_pool.py  P prefill + M decode replicas, each with its side's kv_transfer_config
    disagg_cli.py   `workbench disagg ...`

Replicas split independent requests: each has its own engine, KV pool and prefix cache, so
where a request lands decides whether its prefix is already cached (seed 001 step 08, seed
003). Scaling efficiency = throughput_N / (N x throughput_1) (`workbench.planning`). Experiments
through the router (its templates' targets, layouts, scaling) are
`workbench.experiments.studies.layouts`; a run's per-replica read-out is
`workbench.analysis.replicas`.
"""

from __future__ import annotations

from workbench.router.config import RouterConfig
from workbench.router.policies import (
    POLICIES,
    Decision,
    LeastOutstandingPolicy,
    NoLiveReplicaError,
    PrefixAwarePolicy,
    ReplicaLoad,
    RoundRobinPolicy,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)

__all__ = [
    "POLICIES", "Decision", "LeastOutstandingPolicy", "NoLiveReplicaError",
    "PrefixAwarePolicy", "ReplicaLoad", "RoundRobinPolicy", "RouteRequest", "RouterConfig",
    "RoutingPolicy", "make_policy",
]
