"""KV transfer: vLLM's KV connector (v1) shape and the OffloadingConnector's tiers.

    metadata.py   KVConnectorMetadata / KVConnectorOutput / KVConnectorStats (shared leaves)
    base.py       KVConnectorBase_V1: the scheduler-side and worker-side methods
    tiers.py      the scheduler's view of the host pool (LRU by block hash) and the disk tier
    host_pool.py  the worker's host tensors and the copies device <-> host <-> disk
    offloading_connector.py   OffloadingConnector (CPUOffloadingSpec, TieringOffloadingSpec)
    factory.py    KVConnectorFactory: kv_transfer_config -> a connector for a role
"""
