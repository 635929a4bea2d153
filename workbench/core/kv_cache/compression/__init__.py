"""KV compression: eviction policies deciding which logical blocks a request drops.

    policy.py         KVCompressionPolicy, RequestKVView, EvictionDecision, the registry
    streaming_llm.py  attention sinks + a recent window (score-free)
    h2o.py, snapkv.py, pyramidkv.py   score-based policies (per-block attention scores)

The manager (`KVCacheManager.evict_blocks`) applies a decision; docs/kv_compression.md.
"""

from workbench.core.kv_cache.compression.policy import (
    EvictionDecision,
    KVCompressionPolicy,
    RequestKVView,
    make_policy,
    register_policy,
    registered_methods,
)

__all__ = [
    "EvictionDecision",
    "KVCompressionPolicy",
    "RequestKVView",
    "make_policy",
    "register_policy",
    "registered_methods",
]
