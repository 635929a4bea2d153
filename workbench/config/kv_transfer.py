"""vLLM's `kv_transfer_config`, validated: which KV connector an engine runs and its settings.

    kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30,
                                                      "block_size": 16,
                                                      "spec_name": "CPUOffloadingSpec"}}

`OffloadingConnector` (vLLM 0.32's name) keeps a second KV tier in host memory (an LRU pool of
`cpu_bytes_to_use` bytes, keyed by the block hash chain); `spec_name="TieringOffloadingSpec"`
adds a third tier, a folder of content-addressed files (`disk_path`) that several engine
instances can share. vLLM's OffloadingConnector runs on CUDA, ROCm and XPU; this one also runs
on CPU, where "host" and "device" are both RAM (`docs/kv_offload.md` says what a copy costs
there and on a GPU).

Per request: `SamplingParams(extra_args={"kv_transfer_params": {"max_load_tokens": K}})` (the
OpenAI server's `kv_transfer_params` field) caps the tokens loaded from the external tiers
(validated by `workbench.config.kv_transfer_params`).

    kv_transfer_config={"kv_connector": "P2pConnector", "kv_role": "kv_producer",
                        "kv_connector_extra_config": {"side_channel_port": 0}}

`P2pConnector` hands a request's KV from a prefill instance (`kv_producer`) to a decode
instance (`kv_consumer`) over a point-to-point channel (ZeroMQ over TCP), with NixlConnector's
handshake in `kv_transfer_params`: `do_remote_decode` on the prefill request; the prefill
returns `do_remote_prefill`, `remote_engine_id`, `remote_request_id`, `remote_block_ids`,
`remote_host`, `remote_port`, which the decode request carries (`docs/disaggregation.md`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

KV_CONNECTORS = ("OffloadingConnector", "P2pConnector")
# zmq: everything over ZeroMQ; torch_dist: control over ZeroMQ, the KV over a torch.distributed
# group per pair (gloo for CPU caches, NCCL for CUDA ones; p2p_torch_transport)
P2P_TRANSPORTS = ("zmq", "torch_dist")
TORCH_DIST_BACKENDS = ("auto", "gloo", "nccl")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
OFFLOADING_SPECS = ("CPUOffloadingSpec", "TieringOffloadingSpec")


def _positive_number(where: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where} {name} ({value!r}) must be a number > 0")


def _known_keys(where: str, cls: type, given: dict[str, Any]) -> None:
    """Refuse keys that are not fields of the dataclass `cls`, naming them."""
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: "
                         f"{', '.join(sorted(allowed))}")


def unusable_folder(path: str) -> str | None:
    """Why `path` cannot hold the disk tier (None: it can), without creating anything: it
    exists and is not a folder, the nearest existing folder above it is a file, or the folder
    it is (or would be created in) is not writable."""
    p = Path(path)
    if os.path.exists(p) and not os.path.isdir(p):
        return "is a file, not a folder"
    existing = p if os.path.exists(p) else next(
        (a for a in p.absolute().parents if os.path.exists(a)), None)
    if existing is None or not os.path.isdir(existing):
        return f"cannot be created: {str(existing)!r} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == p:
            return "is not writable"
        return f"cannot be created: {str(existing)!r} is not writable"
    return None


def positive_int(where: str, name: str, value: Any, minimum: int = 1) -> int:
    """`value`, refused (naming `where` and `name`) unless an integer >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where} {name} ({value!r}) must be an integer >= {minimum}")
    return value


@dataclass
class OffloadingConfig:
    """`kv_connector_extra_config` of the OffloadingConnector."""

    cpu_bytes_to_use: int
    block_size: int | None = None  # tokens per offloaded block; None: the KV cache's
    spec_name: str = "CPUOffloadingSpec"
    disk_path: str | None = None  # TieringOffloadingSpec: the shared folder
    disk_bytes_to_use: int | None = None  # TieringOffloadingSpec: LRU cap on the folder
    namespace: str | None = None  # shared-store key prefix; None: derived from the model
    load_timeout_s: float = 30.0  # a load still running after this is given up: recompute

    WHERE = "kv_transfer_config kv_connector_extra_config"

    def __post_init__(self) -> None:
        w = self.WHERE
        positive_int(w, "cpu_bytes_to_use", self.cpu_bytes_to_use)
        if self.block_size is not None:
            positive_int(w, "block_size", self.block_size)
        if self.spec_name not in OFFLOADING_SPECS:
            raise ValueError(f"{w} spec_name ({self.spec_name!r}) must be one of "
                             f"{', '.join(OFFLOADING_SPECS)}")
        tiering = self.spec_name == "TieringOffloadingSpec"
        if tiering:
            if not (isinstance(self.disk_path, str) and self.disk_path):
                raise ValueError(f"{w} disk_path ({self.disk_path!r}) is required for "
                                 "TieringOffloadingSpec: the folder of the shared tier")
            problem = unusable_folder(self.disk_path)
            if problem:
                raise ValueError(f"{w} disk_path ({self.disk_path!r}) {problem}; it must be a "
                                 "folder this process can create or write (the disk tier's "
                                 "files live under it)")
        if not tiering and (self.disk_path is not None or self.disk_bytes_to_use is not None):
            raise ValueError(f"{w} disk_path / disk_bytes_to_use are only for "
                             "spec_name 'TieringOffloadingSpec'")
        if self.disk_bytes_to_use is not None:
            positive_int(w, "disk_bytes_to_use", self.disk_bytes_to_use)
        if self.namespace is not None and (not isinstance(self.namespace, str)
                                           or not self.namespace.replace("-", "").replace(
                                               "_", "").isalnum()):
            raise ValueError(f"{w} namespace ({self.namespace!r}) must be letters, digits, "
                             "'-' or '_'")
        _positive_number(w, "load_timeout_s", self.load_timeout_s)

    @classmethod
    def from_dict(cls, extra: dict[str, Any]) -> OffloadingConfig:
        _known_keys(cls.WHERE, cls, extra)
        if "cpu_bytes_to_use" not in extra:
            raise ValueError(f"{cls.WHERE} needs cpu_bytes_to_use (the host tier's size in "
                             "bytes) for the OffloadingConnector")
        return cls(**extra)


@dataclass
class P2pConfig:
    """`kv_connector_extra_config` of the P2pConnector."""

    # one of P2P_TRANSPORTS; a torch_dist consumer needs a torch_dist producer (a zmq consumer
    # reads from either); NIXL is not built
    transport: str = "zmq"
    # transport torch_dist: auto = nccl for a CUDA KV cache, gloo for a CPU one; gloo on a
    # CUDA cache stages the KV through host memory (NCCL needs one GPU per instance)
    torch_dist_backend: str = "auto"
    side_channel_host: str = "127.0.0.1"  # where the producer serves its blocks
    side_channel_port: int = 0  # 0: a free port, announced in kv_transfer_params
    abort_timeout_s: float = 120.0  # producer: blocks nobody read by then are freed
    load_timeout_s: float = 30.0  # consumer: a read not done by then -> recompute
    # producer: copy each layer's KV of a prefill leg to a host send buffer as soon as the
    # layer has run (overlapping the later layers), free the device blocks at the finish and
    # serve reads from the buffer; False: hold the device blocks until they are read
    layerwise: bool = False
    send_buffer_bytes: int = 1 << 30  # layerwise: host bytes for staged prefills
    # consumer: host bytes for KV pushed by layerwise producers before the decode request
    # arrives (kept until abort_timeout_s); a push beyond it is dropped and that read pulls
    push_inbox_bytes: int = 1 << 30
    # consumer: a read whose KV was pushed here waits this long for the pushes to complete
    # (they may still be on the wire when the decode request comes), then pulls
    push_wait_s: float = 1.0
    # consumer: the producers whose side channels it reads from ("host" or "host:port",
    # IPv6 as "[addr]:port"); None: this host only (loopback, localhost, its own names and
    # addresses). Another producer named in a request is not contacted (recomputed)
    trusted_producers: list[str] | None = None
    # layerwise producer: the decode instances it pushes to (as above; None: this host). A
    # push target named in a request that is not trusted gets no push (it pulls)
    trusted_consumers: list[str] | None = None

    WHERE = "kv_transfer_config kv_connector_extra_config"

    def __post_init__(self) -> None:
        w = self.WHERE
        if not isinstance(self.layerwise, bool):
            raise ValueError(f"{w} layerwise ({self.layerwise!r}) must be true or false")
        positive_int(w, "send_buffer_bytes", self.send_buffer_bytes)
        positive_int(w, "push_inbox_bytes", self.push_inbox_bytes)
        if self.transport not in P2P_TRANSPORTS:
            raise ValueError(f"{w} transport ({self.transport!r}) must be one of "
                             f"{', '.join(P2P_TRANSPORTS)}")
        if self.torch_dist_backend not in TORCH_DIST_BACKENDS:
            raise ValueError(f"{w} torch_dist_backend ({self.torch_dist_backend!r}) must be "
                             f"one of {', '.join(TORCH_DIST_BACKENDS)}")
        if self.torch_dist_backend != "auto" and self.transport != "torch_dist":
            raise ValueError(f"{w} torch_dist_backend ({self.torch_dist_backend!r}) is only "
                             f"for transport 'torch_dist' (transport is {self.transport!r})")
        if not isinstance(self.side_channel_host, str) or not self.side_channel_host:
            raise ValueError(f"{w} side_channel_host ({self.side_channel_host!r}) must be a "
                             "host name or address")
        positive_int(w, "side_channel_port", self.side_channel_port, 0)
        if self.side_channel_port > 65535:
            raise ValueError(f"{w} side_channel_port ({self.side_channel_port}) must be "
                             "<= 65535")
        for name in ("abort_timeout_s", "load_timeout_s", "push_wait_s"):
            _positive_number(w, name, getattr(self, name))
        for key in ("trusted_producers", "trusted_consumers"):
            peers = getattr(self, key)
            if peers is None:
                continue
            if not isinstance(peers, list) or not peers:
                raise ValueError(f"{w} {key} ({peers!r}) must be a non-empty list such as "
                                 '["10.0.0.5", "node-1:5600"] (omit it to trust this host '
                                 "only)")
            for entry in peers:
                parse_peer(f"{w} {key}", entry)

    @classmethod
    def from_dict(cls, extra: dict[str, Any]) -> P2pConfig:
        _known_keys(cls.WHERE, cls, extra)
        return cls(**extra)


@dataclass
class KVTransferConfig:
    """vLLM's KVTransferConfig (the fields this engine uses)."""

    kv_connector: str | None = None
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    engine_id: str | None = None

    def __post_init__(self) -> None:
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_transfer_config kv_connector ({self.kv_connector!r}) must be "
                             f"one of {', '.join(KV_CONNECTORS)}")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_transfer_config kv_role ({self.kv_role!r}) must be one of "
                             f"{', '.join(KV_ROLES)}")
        if not isinstance(self.kv_connector_extra_config, dict):
            raise ValueError("kv_transfer_config kv_connector_extra_config "
                             f"({self.kv_connector_extra_config!r}) must be a dict")
        if self.kv_connector == "OffloadingConnector" and self.kv_role != "kv_both":
            raise ValueError(f"kv_transfer_config kv_role ({self.kv_role!r}) must be 'kv_both' "
                             "for the OffloadingConnector (it saves and loads)")
        if self.engine_id is not None and (not isinstance(self.engine_id, str)
                                           or not self.engine_id):
            raise ValueError(f"kv_transfer_config engine_id ({self.engine_id!r}) must be a "
                             "non-empty string")
        self.offloading  # validates the extra config up front  # noqa: B018
        self.p2p  # noqa: B018

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def p2p(self) -> P2pConfig | None:
        if self.kv_connector != "P2pConnector":
            return None
        return P2pConfig.from_dict(self.kv_connector_extra_config)

    @property
    def offloading(self) -> OffloadingConfig | None:
        if self.kv_connector != "OffloadingConnector":
            return None
        return OffloadingConfig.from_dict(self.kv_connector_extra_config)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any] | KVTransferConfig) -> KVTransferConfig:
        if isinstance(cfg, KVTransferConfig):
            return cfg
        if not isinstance(cfg, dict):
            raise ValueError(f"kv_transfer_config ({cfg!r}) must be a dict such as "
                             '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both", '
                             '"kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824}}')
        _known_keys("kv_transfer_config", cls, cfg)
        return cls(**cfg)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


def parse_peer(where: str, entry: Any) -> tuple[str, int | None]:
    """("host", port or None) of a "host", "host:port" or "[v6 address]:port" entry; the
    host lowercased, without brackets."""
    ok = isinstance(entry, str) and entry.strip() == entry and entry != ""
    host: str = entry if ok else ""
    port: str | None = None
    if ok and entry.startswith("["):  # [v6] or [v6]:port
        end = entry.find("]")
        host, rest = entry[1:end], entry[end + 1:]
        ok = end > 1 and (rest == "" or rest.startswith(":"))
        port = rest[1:] if ok and rest else None
    elif ok and entry.count(":") == 1:  # host:port (a bare v6 address has several colons)
        host, port = entry.split(":")
    if ok and port is not None:
        ok = port.isdigit() and 0 < int(port) <= 65535
    if not ok or not host or any(c.isspace() or c in "/@[]" for c in host):
        raise ValueError(f"{where} entry ({entry!r}) must be \"host\", \"host:port\" or "
                         "\"[IPv6 address]:port\" with a port in 1..65535")
    return host.lower(), None if port is None else int(port)
