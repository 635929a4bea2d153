"""Paged KV cache bookkeeping (pure Python, no torch): blocks, LRU free queue, prefix cache.

    hashing.py     chained block keys (sha256 by default, injectable)
    block.py       KVCacheBlock
    free_queue.py  FreeKVCacheBlockQueue (doubly linked LRU list)
    block_pool.py  BlockPool (null block, free queue, hash -> block map)
    manager.py     KVCacheManager (what the scheduler calls)
    sizing.py      get_num_blocks: the pool's size in blocks from the worker's bytes
"""

from workbench.core.kv_cache.block import KVCacheBlock
from workbench.core.kv_cache.block_pool import BlockPool
from workbench.core.kv_cache.free_queue import FreeKVCacheBlockQueue
from workbench.core.kv_cache.hashing import (
    NONE_HASH,
    BlockHash,
    HashFn,
    block_extra_keys,
    extend_block_hashes,
    hash_block_tokens,
    hash_request_blocks,
    sha256_hash_fn,
)
from workbench.core.kv_cache.manager import KVCacheManager, PrefixCacheStats

__all__ = [
    "NONE_HASH",
    "BlockHash",
    "BlockPool",
    "FreeKVCacheBlockQueue",
    "HashFn",
    "KVCacheBlock",
    "KVCacheManager",
    "PrefixCacheStats",
    "block_extra_keys",
    "extend_block_hashes",
    "hash_block_tokens",
    "hash_request_blocks",
    "sha256_hash_fn",
]
