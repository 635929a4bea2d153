"""LLMEngine: owns the model runner, the scheduler and the stats; `step()` is one iteration.

    add_request() -> validated Request (Processor) into the scheduler's waiting queue
    step():  schedule() -> execute_model() -> update_from_output() -> make_stats() -> stats row

Start-up, as vLLM's EngineCore: the model runner (rank 0's; it drives the other tensor-
parallel ranks) measures the bytes the KV pool may take (`determine_available_memory`,
workbench/worker/kv_cache_sizing.py), `get_num_blocks` turns them into blocks
(workbench/core/kv_cache/sizing.py), the runner allocates them, and the scheduler gets as many.
Collaborators, one file each: the Processor (prompt -> Request), the KV connector's
bookkeeping, the step-failure handling (`step_failures.py`: failures stay with their
requests), the metrics (`workbench.metrics`: SchedulerStats in, vLLM's counters out).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from workbench import profiling
from workbench.config import EngineConfig
from workbench.core.batch_composition import BatchComposition, compose
from workbench.core.kv_cache.sizing import get_num_blocks
from workbench.core.outputs import LogprobsTensors, ModelRunnerOutput
from workbench.core.request import Request, RequestStatus
from workbench.core.sched.output import SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.engine.kv_connector_bookkeeping import (
    KVConnectorBookkeeping,
    create_scheduler_connector,
)
from workbench.engine.processor import Processor, PromptType
from workbench.engine.step_failures import StepFailures
from workbench.executor.tp_model_runner import create_model_runner
from workbench.metrics.loggers import LoggingStatLogger, preemption_warning
from workbench.metrics.stats import EngineStats, StepRecord
from workbench.metrics.step_account import step_account
from workbench.sampling_params import SamplingParams
from workbench.worker.kv_cache_sizing import determine_available_memory, pool_bytes_per_block
from workbench.worker.memory_readout import memory_readout

MAX_ERROR_RECORDS = 100


class LLMEngine:
    def __init__(self, config: EngineConfig, log_stats: bool = False) -> None:
        """`log_stats`: log vLLM's engine line every WORKBENCH_LOG_STATS_INTERVAL seconds
        (`workbench.metrics.loggers`; the server turns it on, `LLM` off unless asked)."""
        self.config = config
        cc, sc = config.cache_config, config.scheduler_config
        self.processor = Processor(config, connector=None)
        self.max_model_len = self.processor.max_model_len
        self.tokenizer = self.processor.tokenizer
        self.vocab_size = self.processor.vocab_size
        # tensor_parallel_size > 1: this is TP rank 0's runner, driving the other ranks
        # (it owns the speculative proposer, `runner.drafter`, and a draft model's runner)
        self.runner = create_model_runner(config)
        try:
            self.kv_memory = determine_available_memory(self.runner, config)
            self.num_blocks = get_num_blocks(
                self.kv_memory.available_bytes, self.bytes_per_block, cc.block_size,
                self.max_model_len, cc.num_gpu_blocks_override, self.kv_memory.source)
        except BaseException:
            self.runner.shutdown()  # TP: stop the worker processes the runner started
            raise
        self.runner.initialize_kv_cache(self.num_blocks)  # the draft model's blocks too
        spec = config.speculative_config
        assert not isinstance(spec, dict)
        # a draft model writes k draft positions after each step: slots allocated ahead
        lookahead = spec.num_speculative_tokens if spec and spec.method != "ngram" else 0
        connector = create_scheduler_connector(config, self.bytes_per_block)
        self.processor.connector = connector
        self.scheduler = Scheduler(sc, cc, self.num_blocks, num_lookahead_tokens=lookahead,
                                   connector=connector,
                                   num_layers=config.model_config.num_layers)
        self.stats = EngineStats()
        self.stat_logger = LoggingStatLogger(device=config.device) if log_stats else None
        # Failures kept for inspection (newest MAX_ERROR_RECORDS; `step_failures.py`).
        self.errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERROR_RECORDS)
        self.kv_connector = KVConnectorBookkeeping(self.scheduler, self.runner, self.errors)
        self.failures = StepFailures(self.scheduler, self.runner, self.errors, cc.block_size,
                                     config.parallel_config.tensor_parallel_size)

    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block id costs: the target's layers, plus the draft model's."""
        return pool_bytes_per_block(self.runner)

    def memory_readout(self) -> dict[str, Any]:
        """The memory table (`workbench.worker.memory_readout`)."""
        return memory_readout(self.runner, self.kv_memory, self.num_blocks, self.config)

    # ----------------------------------------------------------------- intake
    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        return self.processor.tokenize(prompt)

    def make_request(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> Request:
        """Validate and build a Request (raises ValueError; nothing is enqueued)."""
        return self.processor.make_request(prompt, params, request_id, arrival_time,
                                           priority, cache_salt)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request_id ({request.request_id!r}) is already in the engine")
        self.scheduler.add_request(request)

    def abort_request(self, request_ids: list[str]) -> list[Request]:
        done = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        for _ in done:
            self.stats.record_finished("abort")
        return done

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------------- step
    def step(self) -> list[Request]:
        """One iteration. Returns the requests that received tokens (finished and failed
        ones too); failures stay with their requests (`step_failures.py`)."""
        t0 = time.perf_counter()
        with profiling.range("engine.step"):
            with profiling.range("scheduler.schedule"):
                out = self.scheduler.schedule()
            batch = compose(self.scheduler.requests, out)  # before the step advances them
            t_scheduled = time.perf_counter()
            failed: dict[str, str] = {}
            taint: dict[str, int] = {}  # failed in the forward: id -> tokens with valid KV
            output, progressed = self._execute_model(out, failed, taint)
            t_executed = time.perf_counter()
            finished: list[Request] = []
            if output is not None:
                progressed, finished = self._update_from_output(out, output, failed, taint)
        self._record_step(out, output, finished, batch, t0, t_scheduled, t_executed)
        return progressed

    def _execute_model(
        self, out: SchedulerOutput, failed: dict[str, str], taint: dict[str, int],
    ) -> tuple[ModelRunnerOutput | None, list[Request]]:
        """The forward; when it raises, the one-by-one re-run, else the failed step's
        requests (progressed: finished with an error)."""
        try:
            return self.runner.execute_model(out, failed), []
        except Exception as e:  # noqa: BLE001 - fails this step's requests, not the engine
            if self.config.parallel_config.tensor_parallel_size > 1:
                raise  # the executor has stopped every rank: this engine is done (vLLM's)
            self.kv_connector.step_failed()
            output = self.failures.execute_one_by_one(out, failed, taint, e,
                                                      self.stats.num_steps)
            if output is not None:
                return output, []
            return None, self.failures.fail_step(out, e, self.stats)

    def _update_from_output(
        self, out: SchedulerOutput, output: ModelRunnerOutput, failed: dict[str, str],
        taint: dict[str, int],
    ) -> tuple[list[Request], list[Request]]:
        """The runner's output into the scheduler: (requests that got tokens, finished)."""
        if output.kv_connector_output is not None:
            self.kv_connector.update_from_output(output.kv_connector_output, self.stats,
                                                 self.stats.num_steps)
        if output.prompt_logprobs:
            self._add_prompt_logprobs(out, output.prompt_logprobs, failed)
        sched = self.scheduler
        with profiling.range("scheduler.update"):
            progressed, finished = sched.update_from_output(out, output, failed)
        if failed:
            progressed.extend(self.failures.fail_requests(failed, "request", self.stats, taint))
        if output.spec_token_ids:  # the worker's drafts, for requests still running
            sched.update_draft_token_ids(output.spec_token_ids)
        if output.spec_decode_error is not None:
            self.errors.append({"step": self.stats.num_steps, "scope": "propose",
                                "request_ids": [], "message": output.spec_decode_error})
        return progressed, finished

    def _add_prompt_logprobs(
        self, out: SchedulerOutput, runs: dict[str, LogprobsTensors], failed: dict[str, str]
    ) -> None:
        """Hand each request its run of prompt logprobs (`Request.add_prompt_logprobs`);
        a request whose run cannot be added fails alone (in `failed`)."""
        requests = self.scheduler.requests
        for rid in out.num_scheduled_tokens:
            run = runs.get(rid)
            req = requests.get(rid)
            if run is None or req is None or rid in failed:
                continue
            try:
                req.add_prompt_logprobs(run)
            except Exception as e:  # noqa: BLE001 - this request's failure
                failed[rid] = f"prompt logprobs failed: {type(e).__name__}: {e}"

    def _record_step(
        self, out: SchedulerOutput, output: ModelRunnerOutput | None, finished: list[Request],
        batch: BatchComposition, t0: float, t_scheduled: float, t_executed: float,
    ) -> None:
        """The scheduler's report and the finished requests into the stats; the step's row;
        the preemption warning; the periodic log line."""
        report = self.scheduler.make_stats()
        stats = self.stats
        stats.record_scheduler_stats(report)
        stats.record_finished_requests(req.status.finish_reason for req in finished)
        spec = report.spec_decoding_stats
        t1 = time.perf_counter()
        stats.record_step(StepRecord(
            step=stats.num_steps, wall_time_s=t1, duration_s=t1 - t0,
            **step_account(t0, t_scheduled, t_executed, t1, output),
            prefill_tokens=out.num_prefill_tokens, decode_tokens=out.num_decode_tokens,
            running=report.num_running_reqs, waiting=report.num_waiting_reqs,
            kv_cache_usage_perc=report.kv_cache_usage, preemptions=report.num_preemptions,
            spec_draft_tokens=spec.num_draft_tokens if spec else 0,
            spec_accepted_tokens=spec.num_accepted_tokens if spec else 0,
            waiting_for_kv=report.num_waiting_for_remote_kvs,
            **self.kv_connector.step_fields(output),
            prefill_attn_pairs=batch.prefill_attn_pairs,
            decode_context_tokens=batch.decode_context_tokens, num_seqs=batch.num_seqs,
            sampled_rows=batch.sampled_rows, prefill_seqs=batch.prefill_seqs,
        ))
        if out.preempted_request_ids:
            preemption_warning(out.preempted_request_ids, stats.num_preemptions,
                               "swap" if self.scheduler.swap else "recompute")
        if self.stat_logger is not None:
            self.stat_logger.observe(stats)

    # ------------------------------------------------------------ KV connector
    def kv_transfer_info(self) -> dict[str, Any] | None:
        """The KV connector's side channel (disaggregation), None without one."""
        return self.kv_connector.transfer_info()

    def poll_kv_transfers(self) -> None:
        """Between steps: take the KV connector's news now (`KVConnectorBookkeeping.poll`)."""
        self.kv_connector.poll(self.stats, self.stats.num_steps)

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        """Drop the device prefix cache (False while a request holds blocks); with
        `reset_connector` (vLLM's name) the KV connector's tiers too."""
        self.poll_kv_transfers()  # blocks another instance has read since the last step
        done = self.scheduler.kv_cache_manager.reset_prefix_cache()
        if reset_connector:
            done = self.kv_connector.reset_cache() and done
        return done

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker processes (a no-op with one process); idempotent.
        Also run when the engine is collected and, for the workers, at interpreter exit."""
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # interpreter teardown: nothing left to report to
            pass
