"""Routing policies: which replica gets the next request (pure Python, no I/O, no clock).

One piece of code for both clusters: the router (`workbench router`, an entrypoint) and the
simulator's router (`workbench/sim/router.py`) pick with these classes, so a simulated
`router_policy` is the real one. It sits in the core because both sit above it and it needs
only the core's prefix-cache hashing; `workbench.router.policies` re-exports it.

Place in the flow: `Router.pick` passes every replica's `ReplicaLoad` (outstanding requests
now, alive or not: a dead replica, or one this request already failed on, is `alive=False`)
and the request's prompt token ids; the policy returns a `Decision`. The router, not the
policy, counts outstanding requests, so a policy is a small object tests drive with scripted
loads.

    round_robin        replicas in index order, skipping the ones not alive
    least_outstanding  fewest outstanding requests; a tie goes to the first tied replica at
                       or after the one after the previous pick (rotating, not always 0)
    prefix_aware       key = the chained block hash (the engine's prefix-cache key) of the
                       first k FULL blocks of the prompt:

        prompt ids  | b0 | b1 | b2 | b3 | b4 ... |      block_size tokens each
        key         = h(h(h(h(NONE, b0), b1), b2), b3)           k = 4 (fewer if shorter)

        key seen, owner alive, owner not overloaded  -> the owner             "owner"
        key seen, owner alive but overloaded         -> least_outstanding     "load_bound"
        key new (or its owner died)                  -> least loaded, owns it "new_key"
        prompt shorter than one block                -> least_outstanding     "no_key"

Load bound: the owner is overloaded when its outstanding count exceeds
`min + max(load_bound_min, load_bound_frac x mean)` over the alive replicas (defaults 2 and
0.25: with two replicas idle vs 3 in flight the owner is skipped, at 2 it is not). It is the
same idea as SGLang's / vLLM router's cache_aware balance thresholds (`--balance-abs-threshold`
64, `--balance-rel-threshold` 1.5), scaled for a handful of requests in flight; an overloaded
owner keeps its key, so the next request of that prefix goes back to it once it has drained.
"Least loaded" for a new key is fewest outstanding, then fewest keys owned, then lowest index,
so idle replicas take new prefixes in turn. The key table is an LRU of `max_keys` entries.

Requests whose prompts share a first block but differ within the first k blocks get different
keys: raise k to group on a longer shared prefix, lower it to group on a shorter one. The
cache_salt enters the first block's hash, as in the engine, so salted requests never share.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from workbench.core.kv_cache.hashing import BlockHash, HashFn, hash_request_blocks, sha256_hash_fn

POLICIES = ("round_robin", "least_outstanding", "prefix_aware")


class NoLiveReplicaError(RuntimeError):
    """Every replica is dead (or was already tried for this request)."""


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as a policy sees it."""

    index: int
    outstanding: int = 0  # requests sent to it and not finished
    alive: bool = True  # False: dead, or already failed for this request


@dataclass(frozen=True)
class RouteRequest:
    """What a policy may look at: the prompt's token ids (None for a text the router did not
    tokenize) and the cache salt."""

    prompt_token_ids: Sequence[int] | None = None
    cache_salt: str | None = None


@dataclass(frozen=True)
class Decision:
    replica: int
    reason: str  # round_robin | least_outstanding | owner | load_bound | new_key | no_key


def _alive(loads: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    alive = sorted((r for r in loads if r.alive), key=lambda r: r.index)
    if not alive:
        raise NoLiveReplicaError("no live replica to route to")
    return alive


class RoutingPolicy(ABC):
    """Contract: `choose` returns the index of an alive replica from `loads` (raises
    NoLiveReplicaError when none is alive); it may update the policy's own state (a cursor,
    the key table) but never the loads."""

    name: ClassVar[str]

    @abstractmethod
    def choose(self, loads: Sequence[ReplicaLoad], request: RouteRequest | None = None
               ) -> Decision: ...


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0  # the replica index to try first

    def choose(self, loads: Sequence[ReplicaLoad], request: RouteRequest | None = None
               ) -> Decision:
        alive = _alive(loads)
        pick = next((r for r in alive if r.index >= self._next), alive[0])
        self._next = pick.index + 1
        return Decision(pick.index, self.name)


class LeastOutstandingPolicy(RoutingPolicy):
    name = "least_outstanding"

    def __init__(self) -> None:
        self._next = 0  # where the rotation among tied replicas starts

    def choose(self, loads: Sequence[ReplicaLoad], request: RouteRequest | None = None
               ) -> Decision:
        alive = _alive(loads)
        low = min(r.outstanding for r in alive)
        tied = [r for r in alive if r.outstanding == low]
        pick = next((r for r in tied if r.index >= self._next), tied[0])
        self._next = pick.index + 1
        return Decision(pick.index, self.name)


class PrefixAwarePolicy(RoutingPolicy):
    name = "prefix_aware"

    def __init__(
        self, block_size: int = 16, prefix_blocks: int = 4, load_bound_min: float = 2.0,
        load_bound_frac: float = 0.25, max_keys: int = 100_000, hash_fn: HashFn = sha256_hash_fn,
    ) -> None:
        if block_size < 1 or prefix_blocks < 1 or max_keys < 1:
            raise ValueError(f"block_size ({block_size}), prefix_blocks ({prefix_blocks}) and "
                             f"max_keys ({max_keys}) must be >= 1")
        if load_bound_min < 0 or load_bound_frac < 0:
            raise ValueError(f"load_bound_min ({load_bound_min}) and load_bound_frac "
                             f"({load_bound_frac}) must be >= 0")
        self.block_size, self.prefix_blocks = block_size, prefix_blocks
        self.load_bound_min, self.load_bound_frac = load_bound_min, load_bound_frac
        self.max_keys, self.hash_fn = max_keys, hash_fn
        self.owners: OrderedDict[BlockHash, int] = OrderedDict()  # key -> replica, LRU order
        self.keys_owned: Counter[int] = Counter()
        self._fallback = LeastOutstandingPolicy()

    def key(self, request: RouteRequest | None) -> BlockHash | None:
        """The chained hash of the first min(k, full blocks) blocks; None below one block."""
        if request is None or not request.prompt_token_ids:
            return None
        ids = request.prompt_token_ids
        n = min(len(ids) // self.block_size, self.prefix_blocks)
        if n == 0:
            return None
        head = list(ids[: n * self.block_size])
        return hash_request_blocks(self.hash_fn, head, self.block_size, request.cache_salt)[-1]

    def load_bound(self, loads: Sequence[ReplicaLoad]) -> float:
        """min + max(load_bound_min, load_bound_frac x mean) over the alive replicas."""
        alive = _alive(loads)
        counts = [r.outstanding for r in alive]
        mean = sum(counts) / len(counts)
        return min(counts) + max(self.load_bound_min, self.load_bound_frac * mean)

    def choose(self, loads: Sequence[ReplicaLoad], request: RouteRequest | None = None
               ) -> Decision:
        alive = {r.index: r for r in _alive(loads)}
        key = self.key(request)
        if key is None:
            return Decision(self._fallback.choose(loads).replica, "no_key")
        owner = self.owners.get(key)
        if owner is None or owner not in alive:
            pick = min(alive.values(),
                       key=lambda r: (r.outstanding, self.keys_owned[r.index], r.index))
            self._assign(key, pick.index)
            return Decision(pick.index, "new_key")
        self.owners.move_to_end(key)
        if alive[owner].outstanding > self.load_bound(loads):
            return Decision(self._fallback.choose(loads).replica, "load_bound")
        return Decision(owner, "owner")

    def _assign(self, key: BlockHash, replica: int) -> None:
        old = self.owners.pop(key, None)
        if old is not None:
            self.keys_owned[old] -= 1
        self.owners[key] = replica
        self.keys_owned[replica] += 1
        while len(self.owners) > self.max_keys:
            _, evicted = self.owners.popitem(last=False)
            self.keys_owned[evicted] -= 1


def make_policy(name: str, block_size: int = 16, prefix_blocks: int = 4,
                load_bound_min: float = 2.0, load_bound_frac: float = 0.25) -> RoutingPolicy:
    """A policy by name (POLICIES); the prefix knobs matter only for prefix_aware."""
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_outstanding":
        return LeastOutstandingPolicy()
    if name == "prefix_aware":
        return PrefixAwarePolicy(block_size, prefix_blocks, load_bound_min, load_bound_frac)
    raise ValueError(f"policy ({name!r}) must be one of {', '.join(POLICIES)}")
