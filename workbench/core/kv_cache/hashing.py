"""Prefix-cache keys: one chained hash per FULL block of a request's tokens.

    block i hash = hash_fn(block i-1 hash, tuple(block i token ids), extra_keys_i)
    block 0 parent = NONE_HASH;  extra_keys_0 = (cache_salt,) or None;  extra_keys_i>0 = None

Because each key folds in its parent's key, one map lookup vouches for the whole prefix up to
and including that block. Only full blocks are hashed; a partial last block has no key.
The default `sha256_hash_fn` hashes a canonical byte encoding, so keys are identical across
processes (no `hash()` of str, no PYTHONHASHSEED dependence). Any `HashFn` can be injected.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, NewType

BlockHash = NewType("BlockHash", bytes)
"""A block's prefix-cache key: 32 bytes from sha256 (an injected HashFn in tests may return
any hashable value; the manager only uses keys as dict keys)."""

ExtraKeys = tuple[Any, ...] | None
HashFn = Callable[[BlockHash, tuple[int, ...], ExtraKeys], BlockHash]

NONE_HASH: BlockHash = BlockHash(hashlib.sha256(b"workbench.kv_cache.NONE_HASH").digest())
"""The fixed parent of every request's first block."""


def _encode(obj: Any, out: list[bytes]) -> None:
    """Append a type-tagged, length-prefixed encoding of `obj` (no ambiguity between types)."""
    if obj is None:
        out.append(b"N")
    elif isinstance(obj, bytes):
        out.append(b"B" + struct.pack("<I", len(obj)) + obj)
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        out.append(b"S" + struct.pack("<I", len(data)) + data)
    elif isinstance(obj, bool):
        out.append(b"T" if obj else b"F")
    elif isinstance(obj, int):
        out.append(b"I" + struct.pack("<q", obj))
    elif isinstance(obj, tuple):
        out.append(b"U" + struct.pack("<I", len(obj)))
        for item in obj:
            _encode(item, out)
    else:
        raise TypeError(
            f"cannot hash extra key of type {type(obj).__name__}; use None, bytes, str, int, "
            "bool or tuples of those"
        )


_TOKEN_STRUCTS: dict[int, struct.Struct] = {}
_PARENT32_TAG = b"B" + struct.pack("<I", 32)  # _encode's prefix for a 32-byte parent
_sha256 = hashlib.sha256


def sha256_hash_fn(
    parent_hash: BlockHash, token_ids: tuple[int, ...], extra_keys: ExtraKeys
) -> BlockHash:
    """sha256 over: parent (tagged) | n tokens as little-endian int64 | extra keys (tagged)."""
    n = len(token_ids)
    packer = _TOKEN_STRUCTS.get(n)
    if packer is None:
        packer = _TOKEN_STRUCTS[n] = struct.Struct(f"<I{n}q")
    packed = packer.pack(n, *token_ids)
    if extra_keys is None and type(parent_hash) is bytes and len(parent_hash) == 32:
        # The common case, byte-identical to the general encoding below.
        digest = _sha256(_PARENT32_TAG + parent_hash + packed + b"N").digest()
        return digest  # type: ignore[return-value]  # a BlockHash; no NewType call on the hot path
    parts: list[bytes] = []
    _encode(parent_hash, parts)
    parts.append(packed)
    _encode(extra_keys, parts)
    return BlockHash(_sha256(b"".join(parts)).digest())


def block_extra_keys(block_index: int, cache_salt: str | None) -> ExtraKeys:
    """The salt enters the FIRST block only; the chain carries it to every later key."""
    if block_index == 0 and cache_salt is not None:
        return (cache_salt,)
    return None


def hash_block_tokens(
    hash_fn: HashFn,
    parent_hash: BlockHash,
    token_ids: Sequence[int],
    extra_keys: ExtraKeys = None,
) -> BlockHash:
    """vLLM's name: the key of one full block given its parent's key."""
    return hash_fn(parent_hash, tuple(token_ids), extra_keys)


def extend_block_hashes(
    hash_fn: HashFn,
    block_hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    num_full_blocks: int,
    cache_salt: str | None = None,
) -> None:
    """Append the keys of full blocks len(block_hashes) .. num_full_blocks - 1 (each block is
    hashed once per request: the list is the incremental state)."""
    parent = block_hashes[-1] if block_hashes else NONE_HASH
    for i in range(len(block_hashes), num_full_blocks):
        extra = (cache_salt,) if i == 0 and cache_salt is not None else None
        parent = hash_fn(parent, tuple(token_ids[i * block_size : (i + 1) * block_size]), extra)
        block_hashes.append(parent)


def hash_request_blocks(
    hash_fn: HashFn,
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
) -> list[BlockHash]:
    """Keys of every full block of `token_ids`."""
    hashes: list[BlockHash] = []
    extend_block_hashes(
        hash_fn, hashes, token_ids, block_size, len(token_ids) // block_size, cache_salt
    )
    return hashes
