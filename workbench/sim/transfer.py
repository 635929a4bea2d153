"""Links the simulator moves KV over, priced as `workbench calc transfer` prices them.

    link = KVLink.from_spec({"link": "400gbe"}, "target.kv_transfer")   # a calc preset
    link = KVLink.from_spec({"bandwidth_gb_s": 50, "latency_s": 2e-5}, "target.kv_transfer")
    queue = LinkQueue(link)
    start, done = queue.reserve(now, nbytes)

A transfer of B bytes takes `planning.transfer.kv_transfer_time_s(B, bandwidth, latency)` =
B / bandwidth + latency (the presets in `planning.transfer.LINKS`: theoretical one-way peaks).
A `LinkQueue` is one link carrying one transfer at a time, first come first served: a
transfer starts when the link is free (a burst of handed-over prompts queues on the prefill
instance's link, which is what bounds a prefill instance at 1 / transfer_s requests/s in
`calc pd`). `KVLink.scaled(n)`: n such links in parallel (one per GPU of a tensor-parallel
instance, each rank moving its own shard of the KV).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.planning.transfer import LINKS, kv_transfer_time_s

LINK_KEYS = ("link", "bandwidth_gb_s", "latency_s")


@dataclass(frozen=True)
class KVLink:
    """A link: one-way bandwidth (bytes/s) and a fixed latency per transfer (s)."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    name: str = "custom"

    def __post_init__(self) -> None:
        bw, lat = self.bandwidth_bytes_per_s, self.latency_s
        if isinstance(bw, bool) or not isinstance(bw, int | float) or not (
                0 < bw < math.inf):
            raise ValueError(f"KVLink {self.name}: bandwidth_bytes_per_s ({bw!r}) must be a "
                             "finite number > 0")
        if isinstance(lat, bool) or not isinstance(lat, int | float) or not 0 <= lat < math.inf:
            raise ValueError(f"KVLink {self.name}: latency_s ({lat!r}) must be a finite "
                             "number >= 0")

    @classmethod
    def from_spec(cls, spec: Any, where: str) -> KVLink:
        """`{link: PRESET}` (planning.transfer.LINKS) or `{bandwidth_gb_s: X}` (GB/s, 1e9
        bytes), each with an optional `latency_s`; a bad spec is a ValueError naming `where`."""
        problems = link_problems(spec, where)
        if problems:
            raise ValueError("; ".join(problems))
        latency = float(spec.get("latency_s", 0.0))
        if "link" in spec:
            return cls(LINKS[spec["link"]][0], latency, str(spec["link"]))
        gb_s = float(spec["bandwidth_gb_s"])
        return cls(gb_s * 1e9, latency, f"{gb_s:g} GB/s")

    def scaled(self, n: int) -> KVLink:
        """`n` of these links side by side: n x the bandwidth, the same latency."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"KVLink.scaled: n ({n!r}) must be an integer >= 1")
        name = self.name if n == 1 else f"{n} x {self.name}"
        return KVLink(self.bandwidth_bytes_per_s * n, self.latency_s, name)

    def time_s(self, nbytes: float) -> float:
        """nbytes / bandwidth + latency (`planning.transfer.kv_transfer_time_s`)."""
        return kv_transfer_time_s(nbytes, self.bandwidth_bytes_per_s, self.latency_s)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "latency_s": self.latency_s}


def link_problems(spec: Any, where: str) -> list[str]:
    """Everything wrong with a link spec, each named (empty: usable)."""
    if not isinstance(spec, Mapping):
        return [f"{where} ({spec!r}) must be a mapping: {{link: PRESET}} or "
                "{bandwidth_gb_s: GB/s}, optionally with latency_s"]
    out = [f"{where}.{k} is not a link key (keys: {', '.join(LINK_KEYS)})"
           for k in spec if k not in LINK_KEYS]
    if ("link" in spec) == ("bandwidth_gb_s" in spec):
        out.append(f"{where} needs exactly one of link (a preset: {', '.join(sorted(LINKS))}) "
                   "or bandwidth_gb_s")
    if "link" in spec and spec["link"] not in LINKS:
        out.append(f"{where}.link ({spec['link']!r}) must be one of {sorted(LINKS)}")
    gb = spec.get("bandwidth_gb_s", 1.0)
    if isinstance(gb, bool) or not isinstance(gb, int | float) or not 0 < gb < math.inf:
        out.append(f"{where}.bandwidth_gb_s ({gb!r}) must be a finite number > 0 (GB/s)")
    lat = spec.get("latency_s", 0.0)
    if isinstance(lat, bool) or not isinstance(lat, int | float) or not 0 <= lat < math.inf:
        out.append(f"{where}.latency_s ({lat!r}) must be a finite number >= 0 (seconds)")
    return out


class LinkQueue:
    """One link, one transfer at a time, first come first served; counts what it moved."""

    def __init__(self, link: KVLink) -> None:
        self.link = link
        self.free_at = 0.0
        self.bytes_moved = 0
        self.busy_s = 0.0
        self.transfers = 0

    def reserve(self, now: float, nbytes: int) -> tuple[float, float]:
        """(start, done) of a transfer of `nbytes` asked for at `now`."""
        start = max(now, self.free_at)
        done = start + self.link.time_s(nbytes)
        self.free_at = done
        self.bytes_moved += nbytes
        self.busy_s += done - start
        self.transfers += 1
        return start, done
