"""Tensor parallelism over torch.distributed (gloo on CPU, NCCL on CUDA).

    parallel_state      this process's TP rank and group; what layers read at construction
    communication_op    all_reduce / all_gather over the group
    step_input          the per-step message rank 0 sends the workers (a SchedulerOutput delta)
    worker              the spawned worker process (ranks 1..N-1 of the "mp" backend)
    executor            rank 0's side: spawn, send, collect errors, shut down
    tp_runner           create_model_runner: ModelRunner / MultiprocModelRunner /
                        ExternalLauncherModelRunner for the engine

Nothing is imported here, so `workbench.layers` can import parallel_state without pulling in
the engine.
"""
