"""What a P2pConnector checks before KV crosses between instances: whose prompt, which peer.

Prompt digest: the prefill instance hands over the KV of one prompt; the decode request that
reads it must have that prompt. `prompt_digest` is a sha256 over the cache salt and the
prompt's token ids (every token, the partial last block included):

    producer: request_finished -> kv_transfer_params["prompt_digest"], kept with the hold
    consumer: each read names its own request's digest; a handshake whose digest is not the
              request's is not read at all; the producer refuses a read (or release) whose
              digest is not the held prompt's. Either way: a failed load, recomputed.

Not the block hashes: those exist only with prefix caching on, differ between instances
whose hash function or seed differ (`prefix_caching_hash_algo`, PYTHONHASHSEED), cover full
blocks only, and grow with the prompt; the digest is 64 hex digits whatever the prompt.
The cache salt is in it, as it is in vLLM's block hashes: a hold is read by its own tenant.

Trusted peers: a decode instance reads only from the producers it trusts
(`kv_connector_extra_config.trusted_producers`), a layerwise prefill instance pushes only to
the decode instances it trusts (`trusted_consumers`). Unset: this host (loopback and
unspecified addresses, "localhost", its host name and that name's addresses, its own
side_channel_host); set: exactly the listed "host" (any port) and "host:port" entries. Hosts
match as written (case-insensitive) or, both being IP addresses, as the same address; names
are not resolved (a lookup of a name a request chose would itself reach out).
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import struct
from collections.abc import Iterable

from workbench.config.kv_transfer import parse_peer

LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def prompt_digest(prompt_token_ids: list[int], cache_salt: str | None = None) -> str:
    """sha256 (hex) of the salt and the prompt's token ids (little-endian int64s)."""
    h = hashlib.sha256(b"workbench-p2p-prompt-v1\0")
    salt = (cache_salt or "").encode()
    h.update(struct.pack("<Q", len(salt)) + salt)
    h.update(struct.pack(f"<{len(prompt_token_ids)}q", *prompt_token_ids))
    return h.hexdigest()


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def own_hosts(side_channel_host: str) -> set[str]:
    """This host's names and addresses (best effort: a name that does not resolve adds
    nothing)."""
    names = {*LOCAL_NAMES, side_channel_host.lower()}
    try:
        hostname = socket.gethostname().lower()
    except OSError:
        return names
    names.add(hostname)
    try:
        infos = socket.getaddrinfo(hostname, None)
    except OSError:
        infos = []
    names.update(str(info[4][0]).lower() for info in infos)
    return names


class PeerTrust:
    """Which peers (host, port) an instance may connect to; `key`: the config key that
    lists them (trusted_producers or trusted_consumers)."""

    def __init__(self, trusted: list[str] | None, local: Iterable[str], key: str) -> None:
        self.listed = trusted is not None
        self.key = key
        where = f"kv_transfer_config kv_connector_extra_config {key}"
        self.entries = [parse_peer(where, e) for e in trusted] if trusted is not None \
            else [(h.lower(), None) for h in sorted(set(local))]

    def allows(self, host: str, port: int) -> bool:
        host = host.lower()
        addr = _address(host)
        if not self.listed and addr is not None and (addr.is_loopback or addr.is_unspecified):
            return True
        for h, p in self.entries:
            if p is not None and p != port:
                continue
            if h == host:
                return True
            a = _address(h)
            if a is not None and addr is not None and a == addr:
                return True
        return False

    def allows_host(self, host: str | None) -> bool:
        """`host` (a peer's source address: its port is not the side channel's) is trusted
        at some port."""
        ports = {p for _, p in self.entries if p is not None} | {0}
        return host is not None and any(self.allows(host, p) for p in ports)

    def describe(self) -> str:
        if self.listed:
            return ", ".join(h if p is None else f"{h}:{p}" for h, p in self.entries)
        return "this host only (loopback, " + ", ".join(h for h, _ in self.entries) + ")"
