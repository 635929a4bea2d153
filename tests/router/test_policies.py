"""Routing policies on scripted loads: exact replica per request, and why."""

from __future__ import annotations

import pytest

from workbench.core.kv_cache.hashing import hash_request_blocks, sha256_hash_fn
from workbench.router.config import RouterConfig
from workbench.router.policies import (
    LeastOutstandingPolicy,
    NoLiveReplicaError,
    PrefixAwarePolicy,
    ReplicaLoad,
    RoundRobinPolicy,
    RouteRequest,
    make_policy,
)


def loads(*outstanding: int, dead: tuple[int, ...] = ()) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, n, i not in dead) for i, n in enumerate(outstanding)]


def prompt(*head: int, tail: int = 99) -> RouteRequest:
    return RouteRequest([*head, tail])


A = tuple(range(1, 9))  # two full blocks of 4 tokens
B = tuple(range(11, 19))
C = tuple(range(21, 29))


def test_round_robin_cycles_and_skips_dead_replicas() -> None:
    p = RoundRobinPolicy()
    assert [p.choose(loads(5, 0, 0)).replica for _ in range(4)] == [0, 1, 2, 0]
    assert [p.choose(loads(0, 0, 0, dead=(2,))).replica for _ in range(3)] == [1, 0, 1]
    assert [p.choose(loads(0, 0, 0, dead=(0, 1))).replica for _ in range(2)] == [2, 2]
    assert p.choose(loads(0, 0)).reason == "round_robin"
    with pytest.raises(NoLiveReplicaError):
        p.choose(loads(0, 0, dead=(0, 1)))


def test_least_outstanding_picks_the_minimum_and_rotates_ties() -> None:
    p = LeastOutstandingPolicy()
    assert p.choose(loads(2, 0, 1)).replica == 1
    # ties: the first tied replica after the previous pick (1), wrapping around
    assert [p.choose(loads(0, 0, 0)).replica for _ in range(4)] == [2, 0, 1, 2]
    assert p.choose(loads(1, 0, 0)).replica == 1  # tied 1, 2; the rotation is back at 0
    assert p.choose(loads(1, 0, 0)).replica == 2
    assert p.choose(loads(3, 0, 0, dead=(1, 2))).replica == 0  # dead ones excluded
    with pytest.raises(NoLiveReplicaError):
        p.choose(loads(0, dead=(0,)))


def test_prefix_key_is_the_engines_block_hash_of_the_first_k_blocks() -> None:
    p = PrefixAwarePolicy(block_size=4, prefix_blocks=2)
    ids = [*A, 50, 51, 52, 53, 54]
    assert p.key(RouteRequest(ids)) == hash_request_blocks(sha256_hash_fn, ids, 4)[1]
    assert p.key(prompt(*A, tail=1)) == p.key(prompt(*A, tail=2))  # beyond k blocks: ignored
    assert p.key(prompt(*A[:7], 0)) != p.key(prompt(*A))  # differs inside block 2
    one_block = RouteRequest([1, 2, 3, 4, 5])
    assert p.key(one_block) == hash_request_blocks(sha256_hash_fn, [1, 2, 3, 4], 4)[0]
    assert p.key(RouteRequest([1, 2, 3])) is None and p.key(None) is None
    assert p.key(RouteRequest(list(A), "salt")) != p.key(RouteRequest(list(A)))


def test_prefix_aware_sticks_assigns_new_keys_to_least_loaded_and_bounds_load() -> None:
    p = PrefixAwarePolicy(block_size=4, prefix_blocks=2)
    steps = [  # (prompt, loads, expected replica, expected reason)
        (prompt(*A), loads(0, 0), 0, "new_key"),  # tie: fewest keys owned, then index
        (prompt(*B), loads(1, 0), 1, "new_key"),
        (prompt(*C), loads(1, 1), 0, "new_key"),  # tie on load and on keys (1 each): index
        (prompt(*A, tail=7), loads(1, 1), 0, "owner"),
        (prompt(*B, tail=7), loads(5, 2), 1, "owner"),  # 2 <= 2 + max(2, 0.25 x 3.5)
        # owner 0 at 2 vs 0: the bound is 0 + max(2, 0.25 x 1) = 2, and 2 is not above it
        (prompt(*A), loads(2, 0), 0, "owner"),
        (prompt(*A), loads(3, 0), 1, "load_bound"),  # 3 > 2: least outstanding instead
        (prompt(*A), loads(1, 1), 0, "owner"),  # the overloaded owner kept its key
        (RouteRequest([1, 2]), loads(4, 1), 1, "no_key"),  # shorter than one block
    ]
    for req, ls, replica, reason in steps:
        d = p.choose(ls, req)
        assert (d.replica, d.reason) == (replica, reason), (req, ls)
    assert p.keys_owned == {0: 2, 1: 1}


def test_prefix_aware_load_bound_scales_with_the_mean() -> None:
    p = PrefixAwarePolicy(block_size=4, prefix_blocks=2, load_bound_min=2.0,
                          load_bound_frac=0.25)
    assert p.load_bound(loads(10, 2, 4, 4)) == 4.0  # 2 + max(2, 0.25 x 5)
    assert p.load_bound(loads(10, 8, 8, 8)) == 10.125  # 8 + max(2, 0.25 x 8.5)
    assert p.load_bound(loads(10, 0, 8, dead=(1,))) == 10.25  # 8 + 0.25 x 9: dead ones skipped
    assert p.choose(loads(0, 0, 0, 0), prompt(*A)).replica == 0
    assert p.choose(loads(10, 2, 4, 4), prompt(*A)).reason == "load_bound"
    assert p.choose(loads(10, 8, 8, 8), prompt(*A)).reason == "owner"


def test_prefix_aware_reassigns_the_keys_of_a_dead_owner_and_evicts_lru() -> None:
    p = PrefixAwarePolicy(block_size=4, prefix_blocks=2, max_keys=2)
    assert p.choose(loads(0, 0), prompt(*A)).replica == 0
    d = p.choose(loads(0, 0, dead=(0,)), prompt(*A))
    assert (d.replica, d.reason) == (1, "new_key") and p.owners[p.key(prompt(*A))] == 1
    assert p.choose(loads(0, 0), prompt(*A)).replica == 1  # the new owner keeps it
    p.choose(loads(0, 0), prompt(*B))
    p.choose(loads(0, 0), prompt(*C))  # a third key evicts the least recently used (A)
    assert p.key(prompt(*A)) not in p.owners and len(p.owners) == 2
    assert sum(p.keys_owned.values()) == 2
    with pytest.raises(NoLiveReplicaError):
        p.choose(loads(0, 0, dead=(0, 1)), prompt(*A))


def test_make_policy_and_config_validate() -> None:
    assert isinstance(make_policy("prefix_aware", block_size=8), PrefixAwarePolicy)
    assert isinstance(RouterConfig(policy="least_outstanding").make_policy(),
                      LeastOutstandingPolicy)
    with pytest.raises(ValueError, match=r"policy \('random'\) must be one of round_robin"):
        make_policy("random")
    with pytest.raises(ValueError, match=r"num_replicas \(0\) must be an integer >= 1"):
        RouterConfig(num_replicas=0)
    with pytest.raises(ValueError, match=r"load_bound_frac \(-1\) must be >= 0"):
        RouterConfig(load_bound_frac=-1)
    with pytest.raises(ValueError, match="prefix_blocks"):
        PrefixAwarePolicy(prefix_blocks=0)
