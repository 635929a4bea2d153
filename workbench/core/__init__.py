"""The engine core (vLLM v1's `v1/core` + `v1/request.py` + `v1/outputs.py`), torch-free.

    request.py          Request, RequestStatus, RequestTimes: the scheduler's view of a request
    outputs.py          ModelRunnerOutput, LogprobsTensors: what a step's forward returns
    sched/              Scheduler, SchedulerOutput (the step message), the waiting queues,
                        check_stop, the scheduler-side KV connector Protocol
    kv_cache/           KVCacheManager, BlockPool, the free queue, prefix-cache hashing, sizing
    routing.py          the routing policies (which replica gets a request): the router's and
                        the simulator's

Importing any of it imports no torch (tensor types only under TYPE_CHECKING), so the scheduler
and the KV cache manager run in a simulator or a test without a device. It sits below the
model layer and imports only the config, the metrics and the KV-transfer data types
(tests/test_layers.py).
"""
