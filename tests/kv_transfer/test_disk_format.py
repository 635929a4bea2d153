"""The disk tier's files, on the worker's HostKVPool alone (tiny tensors, no model): the
header's sha256 of key + payload is checked on every read, a bad file is removed; a failed
write leaves no temporary file; stale temporary files go at start; pruning counts every file;
an unusable disk_path is refused up front in one line."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from workbench import cli
from workbench.config import kv_transfer as kvt
from workbench.config.kv_transfer import KVTransferConfig
from workbench.config.named_models import bundled_checkpoint
from workbench.distributed.kv_transfer import host_pool
from workbench.distributed.kv_transfer.disk_format import MAGIC, BadKVFile, remove_stale_temps
from workbench.distributed.kv_transfer.host_pool import HostKVPool
from workbench.distributed.kv_transfer.metadata import KVConnectorStats
from workbench.distributed.kv_transfer.tiers import disk_file

KEY_A = hashlib.sha256(b"a").hexdigest()
KEY_B = hashlib.sha256(b"b").hexdigest()


def make_pool(root: Path) -> HostKVPool:
    """2 layers, 8 device blocks of 4 tokens, 2 KV heads of 8; slots of 2 device blocks."""
    gen = torch.Generator().manual_seed(0)
    caches = [torch.randn(2, 8, 4, 2, 8, generator=gen) for _ in range(2)]
    return HostKVPool(caches, num_slots=4, group=2, disk_root=str(root), namespace="t")


def written(pool: HostKVPool, key_hex: str, slot: int, blocks: list[int]) -> Path:
    pool.store(slot, blocks, KVConnectorStats())
    pool.write_file(slot, key_hex, KVConnectorStats())
    return disk_file(pool.disk_root or "", "t", key_hex)


def split(path: Path) -> tuple[bytes, bytearray]:
    """(magic + header line, payload) of a file."""
    blob = path.read_bytes()
    nl = blob.index(b"\n", len(MAGIC)) + 1
    return blob[:nl], bytearray(blob[nl:])


def test_a_file_carries_the_sha256_of_its_key_and_payload(tmp_path: Path) -> None:
    pool = make_pool(tmp_path)
    path = written(pool, KEY_A, 0, [1, 2])
    head, payload = split(path)
    header = json.loads(head[len(MAGIC):])
    assert header == {"key": KEY_A, "shape": [2, 2, 2, 4, 2, 8], "dtype": "torch.float32",
                      "sha256": hashlib.sha256(KEY_A.encode() + b"\n" + payload).hexdigest()}
    assert len(payload) == 2 * 2 * 2 * 4 * 2 * 8 * 4
    assert torch.equal(pool.read_file(KEY_A), pool.host[0])


def damage(kind: str, a: Path, b: Path) -> None:
    """Every kind keeps the file's length and header: only the digest can tell."""
    head_a, pay_a = split(a)
    head_b, pay_b = split(b)
    if kind == "zeroed":
        a.write_bytes(head_a + bytes(len(pay_a)))
    elif kind == "flipped":
        pay_a[len(pay_a) // 2] ^= 0x01
        a.write_bytes(head_a + pay_a)
    elif kind == "swapped":  # each file keeps its header, holds the other's payload
        a.write_bytes(head_a + pay_b)
        b.write_bytes(head_b + pay_a)
    elif kind == "renamed":  # b's file under a's name, its header's key edited to match
        a.write_bytes(head_b.replace(KEY_B.encode(), KEY_A.encode()) + pay_b)


@pytest.mark.parametrize(("kind", "bad"), [("zeroed", ["a"]), ("flipped", ["a"]),
                                           ("swapped", ["a", "b"]), ("renamed", ["a"])])
def test_a_damaged_file_fails_its_check_and_is_removed(tmp_path: Path, kind: str,
                                                       bad: list[str]) -> None:
    pool = make_pool(tmp_path)
    paths = {"a": written(pool, KEY_A, 0, [1, 2]), "b": written(pool, KEY_B, 1, [3, 4])}
    damage(kind, paths["a"], paths["b"])
    for name, key in (("a", KEY_A), ("b", KEY_B)):
        if name in bad:
            with pytest.raises(BadKVFile) as e:
                pool.read_file(key)
            assert str(e.value) == (f"{paths[name]}: payload digest mismatch (the bytes or "
                                    "the key are not the ones written)")
            assert not paths[name].exists()
        else:
            assert torch.equal(pool.read_file(key), pool.host[1])


def test_a_load_checks_every_file_and_reports_each_bad_one(tmp_path: Path) -> None:
    pool = make_pool(tmp_path)
    a, b = written(pool, KEY_A, 0, [1, 2]), written(pool, KEY_B, 1, [3, 4])
    damage("swapped", a, b)
    with pytest.raises(BadKVFile) as e:
        pool.load([("disk", KEY_A, 0, 5), ("disk", KEY_B, 0, 6)], KVConnectorStats())
    assert len(e.value.reasons) == 2
    assert str(e.value).endswith("(and 1 more bad files)")
    assert not a.exists() and not b.exists()


def test_a_short_or_foreign_file_is_bad_too(tmp_path: Path) -> None:
    pool = make_pool(tmp_path)
    a = written(pool, KEY_A, 0, [1, 2])
    head, payload = split(a)
    a.write_bytes(head + payload[:100])
    with pytest.raises(BadKVFile, match=r"100 payload bytes, expected 2048$"):
        pool.read_file(KEY_A)
    assert not a.exists()
    a.write_bytes(b"WBKV1\n{}\n" + payload)  # the old format: unverifiable
    with pytest.raises(BadKVFile, match=r"not a KV block file"):
        pool.read_file(KEY_A)
    assert not a.exists()


def full_disk_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """host_pool's `open`: files opened for writing take 100 bytes, then ENOSPC."""
    real = open

    class Full:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, data: Any) -> int:
            self.f.write(bytes(data)[:100])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

    def fake(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real(file, mode, *args, **kwargs)
        return Full(f) if "w" in mode or "x" in mode else f

    monkeypatch.setattr(host_pool, "open", fake, raising=False)


def files_under(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file())


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pool = make_pool(tmp_path)
    full_disk_open(monkeypatch)
    pool.store(0, [1, 2], KVConnectorStats())
    with pytest.raises(OSError) as e:
        pool.write_file(0, KEY_A, KVConnectorStats())
    assert e.value.errno == errno.ENOSPC
    assert files_under(tmp_path) == []


def test_stale_temporary_files_are_removed_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "t" / "ab"
    folder.mkdir(parents=True)
    now = 1_000_000.0
    for name, age in ((".x.kv.1.aa.tmp", 61.0), (".y.kv.1.bb.tmp", 59.0), ("z.kv", 3600.0)):
        (folder / name).write_bytes(b"x")
        os.utime(folder / name, (now - age, now - age))
    assert remove_stale_temps(tmp_path / "t", now) == 1  # the 59 s one may be a live write
    assert files_under(tmp_path) == [".y.kv.1.bb.tmp", "z.kv"]
    os.utime(folder / ".y.kv.1.bb.tmp", (0, 0))  # long dead
    make_pool(tmp_path)  # a worker starting on the folder sweeps it
    assert files_under(tmp_path) == ["z.kv"]


def test_prune_counts_temporary_files(tmp_path: Path) -> None:
    pool = make_pool(tmp_path)
    paths = [written(pool, hashlib.sha256(bytes([i])).hexdigest(), i, [2 * i, 2 * i + 1])
             for i in range(4)]
    size = paths[0].stat().st_size
    leftover = paths[0].parent / f".{paths[0].name}.1.cc.tmp"  # a full disk's leftover
    leftover.write_bytes(bytes(3 * size))
    for t, p in enumerate([leftover, *paths]):
        os.utime(p, (1000 + t, 1000 + t))
    # 7 files' worth against a cap of 5: the oldest (the leftover) goes, 4 <= 0.9 * 5 remain
    assert pool.prune(5 * size) == 1
    assert not leftover.exists() and all(p.exists() for p in paths)
    assert pool.prune(5 * size) == 0


def tiering(disk_path: str) -> dict[str, Any]:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20, "disk_path": disk_path,
                                          "spec_name": "TieringOffloadingSpec"}}


ALLOWED = ("; it must be a folder this process can create or write (the disk tier's files "
           "live under it)")
WHERE = "kv_transfer_config kv_connector_extra_config disk_path"


def unusable(tmp_path: Path, kind: str) -> tuple[str, str]:
    """(disk_path, what the refusal says about it)."""
    (tmp_path / "file").write_text("x")
    if kind == "file":
        return str(tmp_path / "file"), "is a file, not a folder"
    if kind == "under a file":
        return (str(tmp_path / "file" / "kv"),
                f"cannot be created: {str(tmp_path / 'file')!r} is a file, not a folder")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if kind == "read-only":
        return str(ro), "is not writable"
    return str(ro / "a" / "kv"), f"cannot be created: {str(ro)!r} is not writable"


@pytest.mark.parametrize("kind", ["file", "under a file", "read-only", "parent read-only"])
def test_an_unusable_disk_path_is_refused_up_front(tmp_path: Path, kind: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path, problem = unusable(tmp_path, kind)
    if os.geteuid() == 0:  # root writes anywhere: answer as the folder's mode does for others
        real = os.access
        monkeypatch.setattr(kvt.os, "access", lambda p, mode: real(p, mode) and Path(p).stat(
            ).st_mode & 0o222 != 0)
    with pytest.raises(ValueError) as e:
        KVTransferConfig.from_dict(tiering(path))
    assert str(e.value) == f"{WHERE} ({path!r}) {problem}{ALLOWED}"
    assert not (tmp_path / "ro" / "a").exists()  # nothing created


def test_serve_refuses_an_unusable_disk_path_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, problem = unusable(tmp_path, "under a file")
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--model", str(bundled_checkpoint()),
                  "--kv-transfer-config", json.dumps(tiering(path))])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"workbench serve: error: {WHERE} ({path!r}) " \
                                           f"{problem}{ALLOWED}"
    assert err.count("workbench serve:") == 1


def test_a_start_up_failure_is_prefixed_once(tmp_path: Path) -> None:
    """A failure only the engine finds (its KV budget): `workbench serve` prints one line,
    prefixed once, and exits 1."""
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "serve", "--model", str(bundled_checkpoint()),
         "--kv-cache-memory-bytes", "1", "--port", "0", "--log-level", "critical"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("workbench serve: start-up failed in phase engine: ValueError: "), last
    assert "workbench serve: workbench serve" not in proc.stderr
