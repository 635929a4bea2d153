"""The scheduler's view of the external tiers: which block keys they hold.

HostTier: `num_slots` host slots (one offloaded block each), an LRU map key -> slot. A slot
is *pending* from the step its store is planned until the worker reports the step done, then
*ready* (loadable); a load pins its slots (never evicted mid-copy). Evicting takes the least
recently used ready, unpinned slot; keys are the block hash chain, so a hit is an exact prefix.
Swap slots (preemption_mode="swap") are taken from the same pool, outside the LRU map.

DiskTier: a folder of content-addressed files, `<root>/<namespace>/<key[:2]>/<key>.kv`,
written whole and renamed into place by the worker (so a file that exists is complete;
`disk_format` has the format and the check every read makes);
several engine instances pointed at one folder share it (the Mooncake-store / LMCache
local-disk idea, on a plain filesystem).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from workbench.config.kv_transfer import OffloadingConfig


class HostTier:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"the host tier has no room for one block ({num_slots} slots); "
                             "raise cpu_bytes_to_use")
        self.num_slots = num_slots
        self._lru: OrderedDict[bytes, int] = OrderedDict()  # key -> slot, oldest first
        self._slot_key: dict[int, bytes] = {}
        self._pending: set[int] = set()
        self._pins: dict[int, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, key: bytes) -> int | None:
        """The ready slot holding `key`, or None."""
        slot = self._lru.get(key)
        return None if slot is None or slot in self._pending else slot

    def holds(self, key: bytes) -> bool:
        """Stored or being stored."""
        return key in self._lru

    def touch(self, key: bytes) -> None:
        if key in self._lru:
            self._lru.move_to_end(key)

    def pin(self, slot: int) -> None:
        self._pins[slot] = self._pins.get(slot, 0) + 1

    def unpin(self, slot: int) -> None:
        n = self._pins.get(slot, 0) - 1
        if n > 0:
            self._pins[slot] = n
        else:
            self._pins.pop(slot, None)

    def _take_slot(self) -> int | None:
        if self._free:
            return self._free.pop()
        for key, slot in self._lru.items():  # oldest first
            if slot not in self._pins and slot not in self._pending:
                del self._lru[key]
                del self._slot_key[slot]
                self.evictions += 1
                return slot
        return None

    def allocate(self, key: bytes) -> int | None:
        """A slot for a new block `key` (pending until `complete`); None when every slot is
        pinned or pending."""
        slot = self._take_slot()
        if slot is None:
            return None
        self._lru[key] = slot
        self._slot_key[slot] = key
        self._pending.add(slot)
        return slot

    def admit(self, key: bytes) -> tuple[int | None, bool]:
        """A store of block `key` offered to the tier: (the new pending slot to fill, or None,
        and whether it was skipped for want of room). A key already held is touched (kept
        recent) and needs no store."""
        if self.holds(key):
            self.touch(key)
            return None, False
        slot = self.allocate(key)
        return slot, slot is None

    def complete(self, slots: list[int], ok: bool = True) -> None:
        """Stores done: the slots become loadable (or, failed, are dropped)."""
        for slot in slots:
            self._pending.discard(slot)
            if not ok:
                self.drop(slot)

    def drop(self, slot: int) -> None:
        key = self._slot_key.pop(slot, None)
        if key is not None:
            self._lru.pop(key, None)
        self._pins.pop(slot, None)
        self._pending.discard(slot)
        self._free.append(slot)

    def allocate_anonymous(self, n: int) -> list[int] | None:
        """`n` slots outside the key map (swap); None, nothing taken, when they do not fit."""
        taken: list[int] = []
        for _ in range(n):
            slot = self._take_slot()
            if slot is None:
                self._free.extend(taken)
                return None
            taken.append(slot)
        for slot in taken:
            self.pin(slot)
        return taken

    def release_anonymous(self, slots: list[int]) -> None:
        for slot in slots:
            self._pins.pop(slot, None)
            self._free.append(slot)

    def reset(self) -> bool:
        """Forget every ready, unpinned block (their slots become free); False when some
        are pinned or pending (those stay)."""
        kept = False
        for key, slot in list(self._lru.items()):
            if slot in self._pins or slot in self._pending:
                kept = True
                continue
            del self._lru[key]
            del self._slot_key[slot]
            self._free.append(slot)
        return not kept

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_slots


def disk_file(root: str | Path, namespace: str, key_hex: str) -> Path:
    return Path(root) / namespace / key_hex[:2] / f"{key_hex}.kv"


class DiskTier:
    def __init__(self, root: str | Path, namespace: str) -> None:
        self.root = Path(root)
        self.namespace = namespace
        try:  # the config refused what it can see; this is what it cannot (a full disk, ...)
            (self.root / namespace).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"{OffloadingConfig.WHERE} disk_path ({str(root)!r}) cannot be "
                             f"used: {e.strerror or e}; it must be a folder this process can "
                             "create or write (the disk tier's files live under it)") from e

    def reset(self) -> bool:
        """Delete this namespace's files (every instance sharing it loses them)."""
        ok = True
        for f in (self.root / self.namespace).rglob("*.kv"):
            try:
                f.unlink()
            except OSError:
                ok = False
        return ok

    def holds(self, key: bytes) -> bool:
        """A complete file for `key` exists (written by this or another instance); an
        unreadable folder reads as a miss."""
        try:
            return os.path.isfile(disk_file(self.root, self.namespace, key.hex()))
        except OSError:
            return False
