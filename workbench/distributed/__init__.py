"""Tensor parallelism over torch.distributed (gloo on CPU, NCCL on CUDA): what the layers use.

    parallel_state      this process's TP rank and group; what layers read at construction
    communication_op    all_reduce / all_gather over the group

The processes live elsewhere: `workbench.executor` (rank 0's side: spawn, send, collect
errors, shut down; the driver-side runner) and `workbench.worker.tp_worker` (ranks 1..N-1).
Nothing is imported here, so `workbench.layers` can import parallel_state without pulling in
the engine.
"""
