"""create_model_runner: the engine's ModelRunner for any tensor_parallel_size.

    tp = 1                         ModelRunner (one process, no process group)
    tp > 1, "mp"                   MultiprocModelRunner: rank 0 in the engine process; every
                                   collective entry point (execute_model, profile_run,
                                   profile_cudagraph_memory, initialize_kv_cache) is first sent
                                   to the workers, then run here, so all ranks issue the same
                                   collectives in the same order; rank 0 samples
    tp > 1, "ray"                  the same runner over a RayExecutor: ranks 1..N-1 are Ray
                                   actors in one placement group, on any nodes
    tp > 1, "external_launcher"    ExternalLauncherModelRunner: torchrun started every rank, each
                                   runs the whole (deterministic) engine, nothing is broadcast;
                                   every rank samples the same tokens from the same logits

Rank 0 sizes the KV pool (the engine's memory budget, `profile_run` = the max over ranks) and
every rank allocates that many blocks of its own KV heads, so block ids mean the same on every
rank and the KV cache manager is unchanged. A new ModelRunner method that runs a forward must
be added to `MultiprocModelRunner` too, or rank 0 would wait alone in its collectives.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config import EngineConfig
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.sched.output import SchedulerOutput
from workbench.distributed.communication_op import broadcast_int_from_rank0
from workbench.distributed.parallel_state import (
    destroy_distributed_environment,
    get_tp_group,
    init_from_torchrun_env,
)
from workbench.executor.multiproc_executor import MultiprocExecutor, threads_per_rank
from workbench.worker.model_runner import ModelRunner
from workbench.worker.tp_worker import rank_memory_info


def create_model_runner(config: EngineConfig) -> ModelRunner:
    pc = config.parallel_config
    if pc.tensor_parallel_size == 1:
        return ModelRunner(config)
    if pc.distributed_executor_backend == "external_launcher":
        return ExternalLauncherModelRunner(config)
    return MultiprocModelRunner(config)


def make_executor(config: EngineConfig) -> MultiprocExecutor:
    """The executor of `distributed_executor_backend` ("mp" or "ray"); it starts the workers
    and joins the group."""
    if config.parallel_config.distributed_executor_backend == "ray":
        from workbench.executor.ray_executor import RayExecutor

        return RayExecutor(config)
    return MultiprocExecutor(config)


class MultiprocModelRunner(ModelRunner):
    """TP rank 0 of the "mp" and "ray" backends: mirrors its collective calls to the workers
    (spawned processes, or Ray actors)."""

    def __init__(self, config: EngineConfig) -> None:
        self.executor = make_executor(config)  # starts the workers, joins the group
        try:
            super().__init__(config)
            self.executor.wait_ready()
        except BaseException:
            self.executor.shutdown()
            raise
        # request id -> how many of its tokens the workers hold (new_token_ids' start)
        self.num_sent_tokens: dict[str, int] = {}

    def collective_rpc(
        self,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        include_driver: bool = True,
    ) -> list[Any]:
        """Run `method` on every rank (vLLM's name): a TPWorker or ModelRunner method on the
        workers, ModelRunner's own (not this class's override) here. Results by rank; with
        include_driver=False, only the workers' (ranks 1..N-1)."""
        ex = self.executor
        ex.send_call(method, args, kwargs)
        local: list[Any] = []
        if include_driver:
            try:
                local = [getattr(ModelRunner, method)(self, *args, **(kwargs or {}))]
            except BaseException as e:
                ex.fail(e)
        return local + ex.collect_replies()

    def profile_run(self, num_tokens: int, max_num_seqs: int) -> int:
        """The largest activation peak over the ranks (each rank has its own memory)."""
        return max(self.collective_rpc("profile_run", (num_tokens, max_num_seqs)))

    def profile_cudagraph_memory(self) -> int:
        return max(self.collective_rpc("profile_cudagraph_memory"))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Rank 0's pool size, allocated by every rank."""
        self.collective_rpc("initialize_kv_cache", (num_blocks,))

    def execute_model(
        self, out: SchedulerOutput, failed: dict[str, str] | None = None
    ) -> ModelRunnerOutput:
        """The step message, pickled as it is, to every worker (a step with only finished ids
        too: they drop those requests), then rank 0's own step."""
        if out.scheduled_spec_decode_tokens:
            raise ValueError("speculative decoding with tensor_parallel_size > 1 is not supported")
        if not out.is_empty or out.finished_req_ids:
            self.fill_new_token_ids(out)
            self.executor.send_step(out)
        try:
            return super().execute_model(out, failed)
        except BaseException as e:
            self.executor.fail(e)

    def fill_new_token_ids(self, out: SchedulerOutput) -> None:
        """`CachedRequestData.new_token_ids` for the workers, which do not sample: the tokens
        each cached request gained since they last got it, from rank 0's own request states
        (which hold the tokens it sampled; vLLM sends tokens so to pipeline stages)."""
        sent = self.num_sent_tokens
        for rid in out.finished_req_ids:
            sent.pop(rid, None)
        for data in out.scheduled_new_reqs:
            sent[data.req_id] = len(data.prompt_token_ids)
        cached = out.scheduled_cached_reqs
        new_token_ids: list[list[int]] = []
        for rid in cached.req_ids:
            tokens = self.requests[rid].all_token_ids
            new_token_ids.append(tokens[sent[rid]:])
            sent[rid] = len(tokens)
        cached.new_token_ids = new_token_ids

    def broadcast_stats(self) -> dict[str, float]:
        """Per-step broadcast cost: rank 0's send (pickle + pipe writes) and the workers'
        decode (unpickling the message), mean microseconds, and the mean message size."""
        stats = dict(self.executor.broadcast_stats())
        workers = self.collective_rpc("broadcast_stats", include_driver=False)
        steps = max(1, max(w["num_steps"] for w in workers))
        stats["mean_worker_decode_us"] = 1e6 * max(w["decode_s"] for w in workers) / steps
        return stats

    def memory_per_rank(self) -> list[dict[str, Any]]:
        """Every rank's weight shard and KV tensors, by rank (memory_readout is rank 0's)."""
        return [rank_memory_info(self)] + self.collective_rpc("memory_info", include_driver=False)

    def shutdown(self) -> None:
        self.executor.shutdown()


class ExternalLauncherModelRunner(ModelRunner):
    """One rank of a torchrun launch: every rank runs the engine; nothing is broadcast."""

    def __init__(self, config: EngineConfig) -> None:
        tp = config.parallel_config.tensor_parallel_size
        group = init_from_torchrun_env(config.device)
        try:
            if group.world_size != tp:
                raise ValueError(
                    f"tensor_parallel_size ({tp}) must equal torchrun's WORLD_SIZE "
                    f"({group.world_size}) with distributed_executor_backend='external_launcher'"
                )
            self._old_threads = torch.get_num_threads()
            if config.device == "cpu":
                torch.set_num_threads(threads_per_rank(tp))
            super().__init__(config)
        except BaseException:
            destroy_distributed_environment()
            raise

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Every rank must size the pool alike (same knobs, same profile): checked against
        rank 0's count, since a rank with other block ids would schedule differently."""
        agreed = broadcast_int_from_rank0(num_blocks)
        if agreed != num_blocks:
            raise ValueError(
                f"rank {get_tp_group().rank} sized the KV pool at {num_blocks} blocks, rank 0 "
                f"at {agreed}; with external_launcher every rank must size it alike: pass "
                "num_gpu_blocks_override"
            )
        super().initialize_kv_cache(num_blocks)

    def shutdown(self) -> None:
        destroy_distributed_environment()
        torch.set_num_threads(self._old_threads)
