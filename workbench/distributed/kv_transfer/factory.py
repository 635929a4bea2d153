"""KVConnectorFactory: kv_transfer_config -> the connector for a role (vLLM's name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole

if TYPE_CHECKING:
    from workbench.config import EngineConfig


class KVConnectorFactory:
    @staticmethod
    def create_connector(config: EngineConfig, role: KVConnectorRole,
                         bytes_per_device_block: int) -> KVConnectorBase_V1 | None:
        kt = config.kv_transfer_config
        if kt is None:
            return None
        assert not isinstance(kt, dict)
        if kt.kv_connector == "OffloadingConnector":
            from workbench.distributed.kv_transfer.offloading_connector import (
                OffloadingConnector,
            )

            return OffloadingConnector(config, role, bytes_per_device_block)
        if kt.kv_connector == "P2pConnector":
            from workbench.distributed.kv_transfer.p2p_connector import P2pConnector

            return P2pConnector(config, role, bytes_per_device_block)
        raise ValueError(f"kv_transfer_config kv_connector ({kt.kv_connector!r}) is unknown")
