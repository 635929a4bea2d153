"""`--kv-push`: where each decode replica takes pushed KV (its side channel).

With push the disaggregated router picks the decode replica before the prefill leg and
names that replica's side channel in the prefill request's `kv_transfer_params`
(`remote_host`, `remote_port` beside `do_remote_decode`); a layerwise prefill replica then
sends each layer's KV there while it prefills, and the decode leg's first attempt goes to
that replica. The side channel comes from the decode replica's `GET /kv_transfer_info`,
cached per replica (and URL) until the replica fails. A replica without one (no
P2pConnector, a vLLM server) gets the plain pull flow.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from workbench.router.pool import Replica

logger = logging.getLogger(__name__)

INFO_PATH = "/kv_transfer_info"


class SideChannels:
    """Decode replicas' side channels (host, port), fetched once per replica and URL."""

    def __init__(self, client: httpx.AsyncClient, timeout_s: float = 5.0) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._known: dict[int, tuple[str, tuple[str, int] | None]] = {}

    async def get(self, replica: Replica) -> tuple[str, int] | None:
        known = self._known.get(replica.index)
        if known is not None and known[0] == replica.base_url:
            return known[1]
        channel = await self._fetch(replica)
        self._known[replica.index] = (replica.base_url, channel)
        return channel

    async def _fetch(self, replica: Replica) -> tuple[str, int] | None:
        try:
            resp = await self.client.get(replica.base_url + INFO_PATH, timeout=self.timeout_s)
            info: Any = resp.json() if resp.status_code == 200 else None
        except (httpx.TransportError, ValueError) as e:
            logger.warning("decode replica %d: no side channel (%s); it pulls", replica.index, e)
            return None
        if not isinstance(info, dict):
            logger.warning("decode replica %d answered %s %d: no push to it", replica.index,
                           INFO_PATH, resp.status_code)
            return None
        host, port = info.get("side_channel_host"), info.get("side_channel_port")
        if not isinstance(host, str) or not host or isinstance(port, bool) \
                or not isinstance(port, int) or not 0 < port <= 65535:
            logger.warning("decode replica %d: %s has no usable side channel (%r)",
                           replica.index, INFO_PATH, info)
            return None
        return host, port

    def forget(self, replica: Replica) -> None:
        """The replica failed: ask again (a restart serves another port)."""
        self._known.pop(replica.index, None)
