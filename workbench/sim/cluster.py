"""The cluster a simulated target describes: replicas and their router, a prefill/decode
split with its KV link, a host-memory KV tier; from the target block, with the experiment's
engine config able to vary each (a template's variable is an engine-config key).

    target:                            # or the same keys in baseline / a variant
      num_instances: 4                 # colocated replicas (each does prefill and decode)
      router_policy: prefix_aware      # round_robin | least_outstanding | prefix_aware
      prefix_blocks: 4                 # prefix_aware: full blocks of the prompt in the key
      num_prefill: 1                   # > 0: disaggregated, 1 prefill + num_decode decode
      num_decode: 3                    #   instances (router_policy picks the prefill one)
      decode_policy: least_outstanding # round_robin | least_outstanding (no prefix to reuse)
      kv_transfer: {link: 400gbe}      # the prefill -> decode KV link (calc's presets, or
                                       #   bandwidth_gb_s; latency_s); one per GPU
      kv_offload: {num_cpu_blocks: 4096, link: pcie5-x16}   # a host tier per instance

In the engine config only: `num_workers` (GPUs, as `workbench router`'s knob): the instances
are num_workers / (tensor_parallel_size x pipeline_parallel_size), the decode instances what
the prefill ones leave; `kv_transfer_config` with the OffloadingConnector (CPUOffloadingSpec,
`cpu_bytes_to_use`) sizes the host tier as the engine would (null: no tier), its link from
`target.kv_offload.link`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.sim.router import POLICIES
from workbench.sim.transfer import KVLink, link_problems

DECODE_POLICIES = ("round_robin", "least_outstanding")  # the real router's
# keys a simulated target and an engine config (baseline, variants) may both carry
CLUSTER_KEYS = ("num_instances", "router_policy", "prefix_blocks", "num_prefill",
                "num_decode", "decode_policy", "kv_transfer", "kv_offload")
CLUSTER_KNOBS = (*CLUSTER_KEYS, "num_workers", "kv_transfer_config")
OFFLOAD_KEYS = ("num_cpu_blocks", "link", "bandwidth_gb_s", "latency_s")


@dataclass(frozen=True)
class ClusterSpec:
    """The resolved layout; `kv_offload_blocks` 0: no host tier."""

    num_instances: int = 1  # colocated replicas (ignored when disaggregated)
    num_prefill: int = 0
    num_decode: int = 0
    router_policy: str = "round_robin"
    decode_policy: str = "least_outstanding"
    prefix_blocks: int = 4
    kv_transfer: KVLink | None = None
    kv_offload_blocks: int = 0
    kv_offload_link: KVLink | None = None

    def __post_init__(self) -> None:
        for name in ("num_instances", "prefix_blocks"):
            _need_int(name, getattr(self, name), 1)
        for name in ("num_prefill", "num_decode", "kv_offload_blocks"):
            _need_int(name, getattr(self, name), 0)
        if self.router_policy not in POLICIES:
            raise ValueError(f"router_policy ({self.router_policy!r}) must be one of "
                             f"{list(POLICIES)}")
        if self.decode_policy not in DECODE_POLICIES:
            raise ValueError(f"decode_policy ({self.decode_policy!r}) must be one of "
                             f"{list(DECODE_POLICIES)}")
        if (self.num_prefill > 0) != (self.num_decode > 0):
            raise ValueError(f"num_prefill ({self.num_prefill}) and num_decode "
                             f"({self.num_decode}) must both be >= 1 (disaggregated) or both 0")
        if self.disaggregated and self.kv_transfer is None:
            raise ValueError("a prefill/decode split needs kv_transfer (the link the KV "
                             "crosses): {link: PRESET} or {bandwidth_gb_s: GB/s}")
        if self.kv_offload_blocks and self.kv_offload_link is None:
            raise ValueError("a host KV tier needs kv_offload.link (or bandwidth_gb_s)")
        if self.kv_offload_blocks and self.disaggregated:
            raise ValueError("a host KV tier with a prefill/decode split is not modelled "
                             "(one KV connector per instance)")

    @property
    def disaggregated(self) -> bool:
        return self.num_prefill > 0

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"router_policy": self.router_policy}
        if self.router_policy == "prefix_aware":
            out["prefix_blocks"] = self.prefix_blocks
        if self.disaggregated:
            assert self.kv_transfer is not None
            out |= {"num_prefill": self.num_prefill, "num_decode": self.num_decode,
                    "decode_policy": self.decode_policy,
                    "kv_transfer": self.kv_transfer.describe()}
        else:
            out["num_instances"] = self.num_instances
        if self.kv_offload_blocks:
            assert self.kv_offload_link is not None
            out["kv_offload"] = {"num_cpu_blocks": self.kv_offload_blocks,
                                 "link": self.kv_offload_link.describe()}
        return out


def _need_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} ({value!r}) must be an integer >= {low}")


def merged(target: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The cluster keys: the target's, each overridden by the engine config's."""
    out = {k: target[k] for k in CLUSTER_KEYS if k in target}
    out |= {k: config[k] for k in CLUSTER_KNOBS if k in config}
    return out


def cluster_problems(target: Mapping[str, Any], config: Mapping[str, Any],
                     gpus_per_instance: int = 1) -> list[str]:
    """Everything wrong with the cluster keys of a target and one engine config."""
    keys = merged(target, config)
    out: list[str] = []
    if "kv_transfer" in keys:
        out += link_problems(keys["kv_transfer"], "kv_transfer")
    off = keys.get("kv_offload")
    if off is not None:
        if not isinstance(off, Mapping):
            out.append(f"kv_offload ({off!r}) must be a mapping with keys {list(OFFLOAD_KEYS)}")
        else:
            out += [f"kv_offload.{k} is not a kv_offload key (keys: {', '.join(OFFLOAD_KEYS)})"
                    for k in off if k not in OFFLOAD_KEYS]
            out += link_problems({k: v for k, v in off.items() if k != "num_cpu_blocks"},
                                 "kv_offload")
    bs = config.get("block_size", 16)
    if not out:
        try:
            cluster_spec(target, config, gpus_per_instance, bytes_per_block=1,
                         block_size=bs if isinstance(bs, int) else 16)
        except ValueError as e:
            out.append(str(e))
    return out


def cluster_spec(target: Mapping[str, Any], config: Mapping[str, Any],
                 gpus_per_instance: int, bytes_per_block: int, block_size: int) -> ClusterSpec:
    """The layout of one run; `bytes_per_block` sizes a `kv_transfer_config` host tier."""
    keys = merged(target, config)
    n_prefill = keys.get("num_prefill", 0)
    n_decode = keys.get("num_decode", 0)
    n_inst = keys.get("num_instances", 1)
    if "num_workers" in keys:
        w = keys["num_workers"]
        _need_int("num_workers", w, 1)
        if w % gpus_per_instance:
            raise ValueError(f"num_workers ({w}) must be a multiple of the GPUs per instance "
                             f"(tensor x pipeline parallel size: {gpus_per_instance})")
        if "num_decode" in keys or "num_instances" in keys:
            raise ValueError("num_workers sets the instance count: give num_prefill with it, "
                             "not num_instances or num_decode")
        n_inst = w // gpus_per_instance
        _need_int("num_prefill", n_prefill, 0)
        if n_prefill:
            n_decode = n_inst - n_prefill
            if n_decode < 1:
                raise ValueError(f"num_prefill ({n_prefill}) leaves no decode instance of "
                                 f"num_workers {w} / {gpus_per_instance} GPUs per instance")
    link = keys.get("kv_transfer")
    kv_link = None if link is None else KVLink.from_spec(link, "kv_transfer").scaled(
        gpus_per_instance)
    off = keys.get("kv_offload") or {}
    off_link = None
    if "link" in off or "bandwidth_gb_s" in off:
        off_link = KVLink.from_spec({k: v for k, v in off.items() if k != "num_cpu_blocks"},
                                    "kv_offload").scaled(gpus_per_instance)
    blocks = off.get("num_cpu_blocks", 0)
    _need_int("kv_offload.num_cpu_blocks", blocks, 0)
    if "kv_transfer_config" in keys:
        blocks = _offload_blocks(keys["kv_transfer_config"], bytes_per_block, block_size)
    return ClusterSpec(
        num_instances=n_inst, num_prefill=n_prefill, num_decode=n_decode,
        router_policy=keys.get("router_policy", "round_robin"),
        decode_policy=keys.get("decode_policy", "least_outstanding"),
        prefix_blocks=keys.get("prefix_blocks", 4), kv_transfer=kv_link,
        kv_offload_blocks=blocks, kv_offload_link=off_link)


def _offload_blocks(cfg: Any, bytes_per_block: int, block_size: int) -> int:
    """Host slots of an OffloadingConnector `kv_transfer_config` (0 for null)."""
    if cfg is None:
        return 0
    from workbench.config.kv_transfer import KVTransferConfig

    kt = KVTransferConfig.from_dict(cfg)
    off = kt.offloading
    if off is None:
        raise ValueError(f"kv_transfer_config kv_connector ({kt.kv_connector!r}): the "
                         "simulator models the OffloadingConnector only (a prefill/decode "
                         "split is num_prefill with kv_transfer)")
    if off.spec_name != "CPUOffloadingSpec":
        raise ValueError(f"kv_transfer_config spec_name ({off.spec_name!r}): the simulator "
                         "models CPUOffloadingSpec only (no disk tier)")
    if off.block_size not in (None, block_size):
        raise ValueError(f"kv_transfer_config block_size ({off.block_size}) must be the KV "
                         f"cache's ({block_size}) in the simulator")
    slots = off.cpu_bytes_to_use // bytes_per_block
    if slots < 1:
        raise ValueError(f"kv_transfer_config cpu_bytes_to_use ({off.cpu_bytes_to_use}) holds "
                         f"no block of {bytes_per_block} bytes")
    return slots
