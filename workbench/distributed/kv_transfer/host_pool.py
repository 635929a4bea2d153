"""The worker's side of the tiers: host tensors and the copies device <-> host <-> disk.

Host pool: one tensor [num_slots, num_layers, 2, group, block_size, Hkv, D] in the KV cache's
dtype (fp8 copied as bytes), pinned on CUDA so that copies are DMA transfers. A slot holds one
offloaded block = `group` consecutive device blocks. On CPU "host" and "device" are both RAM:
a copy is a memcpy (its cost is measured and counted, `KVConnectorStats`); on a GPU the same
copies cross PCIe or NVLink (`workbench calc` has the break-even against recomputing).

Disk tier file (`disk_format`): magic, one JSON header line (key, shape, dtype, the sha256 of
key + payload), the slot's raw bytes; written to a temporary name and renamed, so readers
never see half a file. A file that is missing is a failed load; one that fails its check
(magic, header, length, digest) is a failed load too, and it is removed and counted
(`KVConnectorStats.disk_bad_files`): the request recomputes, a later store rewrites it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from workbench.distributed.kv_transfer.disk_format import (
    BadKVFile,
    check_file,
    encode_header,
    remove_if_unchanged,
    remove_stale_temps,
    temp_path,
    tier_files,
)
from workbench.distributed.kv_transfer.metadata import BlockCopy, KVConnectorStats
from workbench.distributed.kv_transfer.tiers import disk_file

logger = logging.getLogger(__name__)


def bytes_view(t: torch.Tensor) -> torch.Tensor:
    """fp8 caches are copied as bytes (no fp8 indexing kernels on CPU)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


class HostKVPool:
    def __init__(self, kv_caches: Sequence[torch.Tensor], num_slots: int, group: int,
                 disk_root: str | None = None, namespace: str = "default") -> None:
        if not kv_caches:
            raise ValueError("no KV caches to offload (allocate the KV cache first)")
        self.caches = [bytes_view(c) for c in kv_caches]
        two, _, bs, hkv, d = self.caches[0].shape
        self.group = group
        self.slot_shape = (len(self.caches), two, group, bs, hkv, d)
        on_cuda = self.caches[0].device.type == "cuda"
        self.host = torch.zeros((num_slots, *self.slot_shape), dtype=self.caches[0].dtype,
                                pin_memory=on_cuda)
        self.block_bytes = len(self.caches) * two * bs * hkv * d * self.caches[0].element_size()
        self.disk_root = disk_root
        self.namespace = namespace
        if disk_root is not None:  # writes that died with their process left these
            removed = remove_stale_temps(Path(disk_root) / namespace, time.time())
            if removed:
                logger.info("disk tier %s: removed %d stale temporary files", disk_root,
                            removed)

    # ---- device -> host ----------------------------------------------------------------
    def store(self, slot: int, block_ids: Sequence[int], stats: KVConnectorStats,
              swap: bool = False) -> None:
        t0 = time.perf_counter()
        ids = torch.tensor(list(block_ids), device=self.caches[0].device)
        n = len(block_ids)
        for layer, cache in enumerate(self.caches):
            self.host[slot, layer, :, :n].copy_(cache[:, ids])
        dt = time.perf_counter() - t0
        if swap:
            stats.swap_out_bytes += n * self.block_bytes
            stats.swap_out_time_s += dt
        else:
            stats.store_bytes += n * self.block_bytes
            stats.store_time_s += dt

    # ---- host / disk -> device ---------------------------------------------------------
    def load(self, copies: Sequence[BlockCopy], stats: KVConnectorStats) -> None:
        """Fill device blocks from host slots and disk files; raises on a missing file,
        BadKVFile (every bad file of the load, each removed) on files that fail their check."""
        t0 = time.perf_counter()
        host = [(ref, sub, bid) for tier, ref, sub, bid in copies if tier == "host"]
        if host:
            dev = self.caches[0].device
            slots = torch.tensor([c[0] for c in host])
            subs = torch.tensor([c[1] for c in host])
            bids = torch.tensor([c[2] for c in host], device=dev)
            for layer, cache in enumerate(self.caches):
                src = self.host[slots, layer, :, subs]  # [n, 2, bs, Hkv, D]
                cache[:, bids] = src.transpose(0, 1).to(dev, non_blocking=True)
            if dev.type == "cuda":
                torch.cuda.current_stream(dev).synchronize()
        files: dict[str, list[tuple[int, int]]] = {}
        for tier, ref, sub, bid in copies:
            if tier == "disk":
                files.setdefault(ref, []).append((sub, bid))
        bad: list[str] = []
        for key_hex, pairs in files.items():
            t1 = time.perf_counter()
            try:
                data = self.read_file(key_hex)
            except BadKVFile as e:  # removed; the other files are still checked (and
                bad.extend(e.reasons)  # removed when bad), the load fails below
                continue
            stats.disk_read_bytes += data.numel() * data.element_size()
            stats.disk_read_time_s += time.perf_counter() - t1
            for sub, bid in pairs:
                for layer, cache in enumerate(self.caches):
                    cache[:, bid] = data[layer, :, sub].to(cache.device)
        if bad:
            raise BadKVFile(bad)
        stats.load_bytes += len(copies) * self.block_bytes
        stats.load_time_s += time.perf_counter() - t0

    # ---- disk ----------------------------------------------------------------------------
    def _path(self, key_hex: str) -> Path:
        assert self.disk_root is not None
        return disk_file(self.disk_root, self.namespace, key_hex)

    def write_file(self, slot: int, key_hex: str, stats: KVConnectorStats) -> None:
        """The slot as a file (temporary name, then rename: readers see all or nothing); on
        an error (a full disk) the temporary file is removed and the error raised."""
        t0 = time.perf_counter()
        path = self._path(key_hex)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.host[slot].contiguous()
        payload = data.view(torch.uint8).reshape(-1).numpy().data  # a memoryview of its bytes
        head = encode_header(key_hex, self.slot_shape, str(data.dtype), payload)
        tmp = temp_path(path)
        try:
            with open(tmp, "xb") as f:
                f.write(head)
                f.write(payload)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        stats.disk_write_bytes += len(payload)
        stats.disk_write_time_s += time.perf_counter() - t0

    def prune(self, max_bytes: int) -> int:
        """Delete the least recently used files of this namespace (modification time; a
        read touches its file) until the folder holds at most 90% of `max_bytes`; every
        file counts (temporary ones too: a full disk's leftovers are pruned like blocks).
        Returns the files deleted. Another instance may be reading one: its load fails and
        recomputes, which is the tier's contract."""
        assert self.disk_root is not None
        files = tier_files(Path(self.disk_root) / self.namespace)
        total = sum(size for _, size, _ in files)
        if total <= max_bytes:
            return 0
        deleted = 0
        for _, size, f in sorted(files, key=lambda t: t[0]):
            if total <= 0.9 * max_bytes:
                break
            try:
                f.unlink()
            except OSError:
                continue
            total -= size
            deleted += 1
        return deleted

    def read_file(self, key_hex: str) -> torch.Tensor:
        """The block stored under `key_hex`; OSError when it cannot be read, BadKVFile
        (the file removed) when it fails its check."""
        path = self._path(key_hex)
        with open(path, "rb") as f:
            seen = os.fstat(f.fileno())
            blob = bytearray(seen.st_size)
            del blob[f.readinto(blob):]  # in place: shorter only if it shrank meanwhile
        want = self.host[0].numel() * self.host.element_size()
        try:
            payload = check_file(blob, path, key_hex, self.slot_shape, str(self.host.dtype),
                                 want)
        except BadKVFile:
            remove_if_unchanged(path, seen)
            raise
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        flat = torch.frombuffer(payload, dtype=torch.uint8)
        return flat.view(self.host.dtype).view(self.slot_shape)
