"""The disk tier end to end on the tiny Llama of test_offloading: a damaged file (zeroed,
one byte flipped, payloads of two files swapped: every length right) is a failed load that
recomputes to the tokens of a run without offload, counted, and the bad file replaced; a full
disk leaves no temporary file and the tokens stay right; a dead write's leftovers are swept
at start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kv_transfer import test_offloading as base
from tests.kv_transfer.test_disk_format import damage, files_under, full_disk_open
from tests.kv_transfer.test_offloading import (
    NUM_DOCS,
    OFFLOAD_BLOCK,
    engine,
    offloading,
    one_by_one,
)
from workbench import LLM
from workbench.core.kv_cache.hashing import extend_block_hashes, sha256_hash_fn
from workbench.distributed.kv_transfer.tiers import disk_file
from workbench.sampling_params import SamplingParams

ckpt, prompts, reference = base.ckpt, base.prompts, base.reference  # the same fixtures

LOADED_BLOCKS = 8  # (65 - 1) // 8 offloaded blocks loaded per prompt
WRITTEN_BLOCKS = 9  # 72 // 8 full blocks of prompt + output written per prompt


def tiering(store: Path, **extra: object) -> dict[str, object]:
    return offloading(spec_name="TieringOffloadingSpec", disk_path=str(store), namespace="t",
                      **extra)


def block_file(store: Path, prompt: list[int], index: int) -> Path:
    keys: list[bytes] = []
    extend_block_hashes(sha256_hash_fn, keys, prompt, OFFLOAD_BLOCK, index + 1)  # type: ignore[arg-type]
    return disk_file(store, "t", keys[index].hex())


def drain(llm: LLM) -> None:
    """Every queued disk write done and reported: the writer's counters reach the engine at
    its next step, so one step runs (a 3-token request: no full block, nothing stored)."""
    llm.engine.runner.kv_connector.flush()
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=1))


@pytest.mark.parametrize(("kind", "num_bad"), [("zeroed", 1), ("flipped", 1), ("swapped", 2)])
def test_a_damaged_file_is_a_failed_load_that_recomputes(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]], tmp_path: Path,
        kind: str, num_bad: int) -> None:
    store = tmp_path / "store"
    a = engine(ckpt, kv_transfer_config=tiering(store))
    assert one_by_one(a, prompts) == reference[:NUM_DOCS]
    a.engine.runner.kv_connector.flush()
    # block 3 of prompt 0 (and, swapped, of prompt 1): a load that reads it reads others too
    bad = [block_file(store, prompts[0], 3), block_file(store, prompts[1], 3)]
    damage(kind, bad[0], bad[1])
    damaged = [p.read_bytes() for p in bad]
    b = engine(ckpt, kv_transfer_config=tiering(store))  # empty device and host tiers
    assert one_by_one(b, prompts) == reference[NUM_DOCS:]
    drain(b)
    st = b.stats()
    assert st["workbench:kv_offload_failed_loads"] == num_bad
    assert st["workbench:kv_offload_tiering_bad_files"] == num_bad
    # disk hits are counted when a load is planned, before it fails
    assert st["workbench:kv_offload_disk_hits"] == NUM_DOCS * LOADED_BLOCKS * OFFLOAD_BLOCK
    errors = list(b.errors())
    assert len(errors) == num_bad and {e["scope"] for e in errors} == {"kv_transfer"}
    assert all("payload digest mismatch" in e["message"] for e in errors)
    pool = b.engine.runner.kv_connector.pool
    for path, old in zip(bad[:num_bad], damaged, strict=False):
        # removed when found; the recompute's store wrote the block again, and it checks
        assert path.read_bytes() != old
        pool.read_file(path.stem)
    assert files_under(store) == sorted(p.name for p in store.rglob("*.kv"))  # no leftovers


def test_a_full_disk_leaves_no_temporary_files(
        ckpt: Path, prompts: list[list[int]], reference: list[list[int]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    llm = engine(ckpt, kv_transfer_config=tiering(store, disk_bytes_to_use=1 << 20))
    full_disk_open(monkeypatch)  # every write: 100 bytes, then ENOSPC
    assert one_by_one(llm, prompts) == reference[:NUM_DOCS]
    drain(llm)
    assert files_under(store) == []  # old code: 54 partial .tmp files, never pruned
    st = llm.stats()
    assert st["workbench:kv_offload_tiering_failed_writes"] == NUM_DOCS * WRITTEN_BLOCKS
    assert st["workbench:kv_offload_tiering_write_bytes"] == 0
    assert st["workbench:kv_offload_tiering_pruned_files"] == 0  # nothing left to prune
    assert {e["scope"] for e in llm.errors()} == {"kv_transfer"}
    monkeypatch.undo()  # room again: new prompts' blocks are written through, whole
    one_by_one(llm, [p[::-1] for p in prompts])
    drain(llm)
    assert len(files_under(store)) == NUM_DOCS * WRITTEN_BLOCKS
    assert llm.stats()["workbench:kv_offload_tiering_failed_writes"] == NUM_DOCS * WRITTEN_BLOCKS
    assert all(f.suffix == ".kv" for f in store.rglob("*") if f.is_file())


def test_a_dead_writes_leftovers_are_swept_at_start(ckpt: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "t" / "ab").mkdir(parents=True)
    left = store / "t" / "ab" / ".ab12.kv.4242.deadbeef.tmp"
    left.write_bytes(bytes(1000))
    os.utime(left, (0, 0))  # long untouched: its writer is gone
    llm: LLM = engine(ckpt, kv_transfer_config=tiering(store))
    assert llm.engine.runner.kv_connector.pool is not None
    assert not left.exists()
