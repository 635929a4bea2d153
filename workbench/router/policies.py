"""Routing policies: the router's view of `workbench.core.routing`, where they live so the
simulator (`workbench/sim/router.py`) picks with the same code (see that module for the
policies, their reasons and the prefix key)."""

from __future__ import annotations

from workbench.core.routing import (
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
    "PrefixAwarePolicy", "ReplicaLoad", "RoundRobinPolicy", "RouteRequest", "RoutingPolicy",
    "make_policy",
]
