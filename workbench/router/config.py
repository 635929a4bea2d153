"""RouterConfig: the router's own knobs (the replicas' engine knobs are `workbench serve` flags).

    workbench router --num-replicas 2 --policy prefix_aware --prefix-blocks 4 --port 8000 \\
        --model DIR [every `workbench serve` engine flag, passed to each replica]

Each field is a flag of `workbench router` (`--num-replicas`, `--policy`, ...). `block_size`
defaults to the replicas' engine block size so the prefix key is the engine's block hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.router.policies import POLICIES, RoutingPolicy, make_policy


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

    def __post_init__(self) -> None:
        ints = {"num_replicas": self.num_replicas, "prefix_blocks": self.prefix_blocks,
                "block_size": self.block_size, "replica_threads": self.replica_threads}
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

    def make_policy(self) -> RoutingPolicy:
        return make_policy(self.policy, self.block_size, self.prefix_blocks,
                           self.load_bound_min, self.load_bound_frac)
