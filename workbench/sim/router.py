"""The simulator's router: the real routing policies (`workbench.core.routing`, the same
classes `workbench router` picks with) over simulated instances.

    router = SimRouter(instances, "prefix_aware", block_size=16, prefix_blocks=4)
    k = router.pick(request)          # index into `instances`

Each pick passes every instance's load as the real router counts it (requests sent to it
and not finished: `SimInstance.num_unfinished`, waiting, running or loading KV) and the
request's prompt token ids and cache salt; every instance is alive (the simulator models no
replica failure). `decisions` counts the policy's reasons (the real router's
`router_routing_decisions_total{reason}`): round_robin, least_outstanding, or for
prefix_aware owner / load_bound / new_key / no_key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from workbench.core.request import Request
from workbench.core.routing import (
    POLICIES,
    ReplicaLoad,
    RouteRequest,
    RoutingPolicy,
    make_policy,
)

__all__ = ["POLICIES", "SimRouter"]


class _Loaded(Protocol):
    @property
    def num_unfinished(self) -> int: ...


class SimRouter:
    """One policy over `instances` (anything with `num_unfinished`). `block_size`: the
    prefix key's block (the instances' KV block size, as the real router's default);
    `prefix_blocks`, `load_bound_min`, `load_bound_frac`: the real router's knobs."""

    def __init__(self, instances: Sequence[_Loaded], policy: str = "round_robin", *,
                 block_size: int = 16, prefix_blocks: int = 4, load_bound_min: float = 2.0,
                 load_bound_frac: float = 0.25) -> None:
        if not instances:
            raise ValueError("SimRouter needs at least one instance")
        if policy not in POLICIES:
            raise ValueError(f"router policy ({policy!r}) must be one of {list(POLICIES)}")
        for name, value in (("block_size", block_size), ("prefix_blocks", prefix_blocks)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"router {name} ({value!r}) must be an integer >= 1")
        self.instances = list(instances)
        self.name = policy
        self.policy: RoutingPolicy = make_policy(policy, block_size, prefix_blocks,
                                                 load_bound_min, load_bound_frac)
        self.decisions: Counter[str] = Counter()

    def pick(self, request: Request) -> int:
        """The index of the instance `request` goes to (the policy's state advances)."""
        loads = [ReplicaLoad(i, inst.num_unfinished) for i, inst in enumerate(self.instances)]
        decision = self.policy.choose(
            loads, RouteRequest(request.prompt_token_ids, request.cache_salt))
        self.decisions[decision.reason] += 1
        return decision.replica
