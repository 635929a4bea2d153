"""LLMEngine: owns the model runner, the scheduler and the stats; `step()` is one iteration.

    add_request() -> validated Request into the scheduler's waiting queue
    step():  schedule() -> execute_model() -> update_from_output() -> stats row

Memory (`_size_kv_pool`, `memory_readout`): the KV pool is num_gpu_blocks_override blocks, or
kv_cache_memory_bytes of KV, or the rest of a whole-process budget,

    KV = budget - weights - activation peak - reserve         (calc.budget_num_blocks)
    budget  = cpu_memory_budget_bytes            (CPU)
            = gpu_memory_utilization x total device memory    (CUDA)
    activation peak = measured by a profile run (ModelRunner.profile_run: a dummy forward of
                      max_num_batched_tokens tokens; the draft model's too, the larger counts)
    reserve = memory_reserve_bytes (+ on CUDA the device memory used outside torch's
              allocator: CUDA context, other processes, and one CUDA-graph capture; + on CPU
              in fp32 the MKL-packed weight copies, `packed_weight_bytes`)

or else a default (max_num_seqs requests of max_model_len, at most 4 GiB). Under one budget,
smaller weights (quantization) or smaller blocks (fp8 KV) become KV capacity.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import deque
from typing import Any, TypedDict

import torch

from workbench import profiling
from workbench.calc import budget_num_blocks, cdiv, max_concurrency, num_blocks_for_budget
from workbench.config import EngineConfig
from workbench.distributed.kv_transfer.base import KVConnectorRole
from workbench.distributed.kv_transfer.factory import KVConnectorFactory
from workbench.distributed.kv_transfer.metadata import KVConnectorOutput
from workbench.engine.request import Request, RequestStatus
from workbench.engine.runner_output import LogprobsTensors, ModelRunnerOutput
from workbench.engine.scheduler import Scheduler
from workbench.engine.scheduler_output import SchedulerOutput
from workbench.executor.tp_runner import create_model_runner
from workbench.kv_transfer_config import kv_transfer_params
from workbench.layers.linear_autotune import linear_backend_report
from workbench.metrics.loggers import LoggingStatLogger, preemption_warning
from workbench.metrics.stats import EngineStats, StepRecord
from workbench.models.tokenizer import load_tokenizer
from workbench.sampling_params import SamplingParams, is_int
from workbench.worker import cpu_threads, hugepages

PromptType = str | list[int] | dict[str, Any]
MAX_ERROR_RECORDS = 100
logger = logging.getLogger(__name__)
DEFAULT_CPU_KV_BYTES = 4 << 30  # like vLLM-CPU's VLLM_CPU_KVCACHE_SPACE default (4 GiB)


class LLMEngine:
    def __init__(self, config: EngineConfig, log_stats: bool = False) -> None:
        """`log_stats`: log vLLM's engine line every WORKBENCH_LOG_STATS_INTERVAL seconds
        (`stat_logger.py`; the server turns it on, `LLM` off unless asked)."""
        self.config = config
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        self.max_model_len: int = mc.max_model_len  # type: ignore[assignment]
        # Filled by _size_kv_pool when the pool is sized from a budget (None otherwise).
        self.budget_bytes: int | None = None
        self.activation_peak_bytes: int | None = None
        self.reserve_bytes: int | None = None
        self.non_torch_bytes: int | None = None
        self.cudagraph_estimate_bytes: int | None = None
        self.kv_pool_source = ""
        self.tokenizer = load_tokenizer(mc.model)
        # tensor_parallel_size > 1: this is TP rank 0's runner, driving the other ranks
        # (it owns the speculative proposer, `runner.drafter`, and a draft model's runner)
        self.runner = create_model_runner(config)
        spec = config.speculative_config
        assert not isinstance(spec, dict)
        # a draft model writes k draft positions after each step: slots allocated ahead
        lookahead = 0
        if spec is not None and spec.method != "ngram":
            lookahead = spec.num_speculative_tokens
        try:
            self.num_blocks = self._size_kv_pool()
        except BaseException:
            self.runner.shutdown()  # TP: stop the worker processes the runner started
            raise
        self.runner.initialize_kv_cache(self.num_blocks)  # the draft model's blocks too
        # the scheduler side of the KV connector (kv_transfer_config); the worker side is
        # the runner's (made with its KV cache)
        connector = KVConnectorFactory.create_connector(
            config, KVConnectorRole.SCHEDULER, self.bytes_per_block)
        self.scheduler = Scheduler(sc, cc, self.num_blocks, num_lookahead_tokens=lookahead,
                                   connector=connector)
        worker_connector = getattr(self.runner, "kv_connector", None)
        if connector is not None and worker_connector is not None:
            handshake = worker_connector.get_handshake_metadata()
            if handshake is not None:  # e.g. the P2pConnector's side channel
                connector.set_xfer_handshake_metadata(handshake)
        self.stats = EngineStats()
        self.vocab_size = int(mc.hf_config["vocab_size"])
        eos = self.tokenizer.eos_token_id
        self.eos_token_id: int | None = eos if eos is not None else (mc.eos_token_ids or [None])[0]
        self._ids = itertools.count()
        self.stat_logger = LoggingStatLogger(device=config.device) if log_stats else None
        # Failures kept for inspection (newest MAX_ERROR_RECORDS): step, scope ("request":
        # one request's sampling/update, "step": the forward, "propose"), ids, message.
        self.errors: deque[dict[str, Any]] = deque(maxlen=MAX_ERROR_RECORDS)

    # ----------------------------------------------------------------- memory
    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block id costs: the target's layers, plus the draft model's."""
        draft = self.runner.draft_runner
        return self.runner.bytes_per_block + (draft.bytes_per_block if draft is not None else 0)

    def _size_kv_pool(self) -> int:
        cc, sc = self.config.cache_config, self.config.scheduler_config
        bpb = self.bytes_per_block
        bs = cc.block_size
        if cc.num_gpu_blocks_override is not None:
            num_blocks, source = cc.num_gpu_blocks_override, "num_gpu_blocks_override"
        elif cc.kv_cache_memory_bytes is not None:
            num_blocks = num_blocks_for_budget(cc.kv_cache_memory_bytes, bpb)
            source = "kv_cache_memory_bytes"
        elif cc.cpu_memory_budget_bytes is not None or cc.gpu_memory_utilization is not None:
            num_blocks = self._size_from_budget(bpb)
            source = ("cpu_memory_budget_bytes" if cc.cpu_memory_budget_bytes is not None
                      else "gpu_memory_utilization")
        else:
            # Default: what max_num_seqs requests of max_model_len could use, at most 4 GiB
            # (on CUDA also at most 90% of the free device memory).
            want = (sc.max_num_seqs * cdiv(self.max_model_len, bs) + 1) * bpb
            cap = DEFAULT_CPU_KV_BYTES
            if self.runner.device.type == "cuda":
                cap = min(cap, int(torch.cuda.mem_get_info()[0] * 0.9))
            num_blocks, source = num_blocks_for_budget(min(want, cap), bpb), "the default budget"
        usable = num_blocks - 1  # block 0 is the null block
        needed = cdiv(self.max_model_len, bs)
        if usable < needed:
            raise ValueError(
                f"the KV cache from {source} has {usable} usable blocks ({usable * bs} tokens "
                f"at block_size {bs}, {bpb} bytes per block), fewer than one request of "
                f"max_model_len ({self.max_model_len}) needs ({needed} blocks); give the pool "
                "more memory/blocks or lower max_model_len"
            )
        self.kv_pool_source = source
        return num_blocks

    def _size_from_budget(self, bpb: int) -> int:
        """Blocks (null block included) the whole-process budget leaves for KV; sets the budget,
        activation peak and reserve the readout reports. One ValueError naming the knob and
        the least budget that fits one max_model_len request when it is too small."""
        cc, sc = self.config.cache_config, self.config.scheduler_config
        weights = self.memory_weight_bytes
        assert sc.max_num_batched_tokens is not None
        draft = self.runner.draft_runner
        runners = [self.runner] + ([draft] if draft is not None else [])
        activation = max(r.profile_run(sc.max_num_batched_tokens, sc.max_num_seqs)
                         for r in runners)
        # CUDA graphs: one capture of the largest decode size, measured (0 when graphs are off)
        graphs = self.runner.profile_cudagraph_memory()
        self.cudagraph_estimate_bytes = graphs
        reserve = cc.memory_reserve_bytes + graphs + self.packed_weight_bytes
        non_torch = 0
        if cc.gpu_memory_utilization is not None:
            dev = self.runner.device
            free, total = torch.cuda.mem_get_info(dev)
            # CUDA context, cuBLAS workspaces, other processes: used, but not by torch tensors
            non_torch = max(0, (total - free) - torch.cuda.memory_reserved(dev))
            budget = int(cc.gpu_memory_utilization * total)
            knob, value = "gpu_memory_utilization", cc.gpu_memory_utilization
        else:
            assert cc.cpu_memory_budget_bytes is not None
            budget = cc.cpu_memory_budget_bytes
            knob, value = "cpu_memory_budget_bytes", budget
        reserve += non_torch
        self.budget_bytes, self.activation_peak_bytes = budget, activation
        self.reserve_bytes, self.non_torch_bytes = reserve, non_torch
        num_blocks = budget_num_blocks(budget, weights, activation, reserve, bpb)
        min_blocks = cdiv(self.max_model_len, cc.block_size) + 1  # + the null block
        if num_blocks < min_blocks:
            least = weights + activation + reserve + min_blocks * bpb
            if knob == "gpu_memory_utilization":
                total = torch.cuda.mem_get_info(self.runner.device)[1]
                need = f"> {least / total:.4f} (of {total} bytes)"
            else:
                need = f">= {least}"
            raise ValueError(
                f"{knob} ({value}) must be {need}: the budget {budget} bytes has to hold the "
                f"weights ({weights}) + the activation peak ({activation}, profile run of "
                f"max_num_batched_tokens={sc.max_num_batched_tokens}) + the reserve "
                f"({reserve}) + KV for one max_model_len ({self.max_model_len}) request "
                f"({min_blocks} blocks of {bpb} bytes, null block included); raise it, "
                "quantize, lower max_model_len or max_num_batched_tokens"
            )
        if knob == "gpu_memory_utilization":
            free = torch.cuda.mem_get_info(self.runner.device)[0]
            if num_blocks * bpb > free:
                raise ValueError(
                    f"gpu_memory_utilization ({value}) leaves {num_blocks * bpb} bytes of KV "
                    f"but only {free} bytes are free on the device (other processes?); "
                    "lower gpu_memory_utilization"
                )
        return num_blocks

    @property
    def packed_weight_bytes(self) -> int:
        """MKL-packed weight copies (CPU fp32, `workbench.layers.cpu_gemm`), target + draft."""
        draft = self.runner.draft_runner
        return self.runner.packed_weight_bytes + (
            draft.packed_weight_bytes if draft is not None else 0)

    @property
    def memory_weight_bytes(self) -> int:
        """Weight bytes in device memory: the target's, plus the draft model's."""
        return self.runner.weight_bytes + self._draft_weight_bytes

    @property
    def _draft_weight_bytes(self) -> int:
        draft = self.runner.draft_runner
        return draft.weight_bytes if draft is not None else 0

    def memory_readout(self) -> dict[str, Any]:
        """The memory table. budget_bytes / activation_peak_bytes / reserve_bytes /
        non_torch_bytes are None unless the pool was sized from a budget; then
        weight_bytes + kv_bytes + activation_peak_bytes + reserve_bytes <= budget_bytes, short
        of it by less than one block (kv_bytes counts the null block: it is allocated)."""
        cc = self.config.cache_config
        bs = cc.block_size
        usable = self.num_blocks - 1
        bpb = self.bytes_per_block
        draft_weights = self._draft_weight_bytes
        return {
            "weight_bytes": self.runner.weight_bytes + draft_weights,
            "draft_weight_bytes": draft_weights,
            "kv_cache_dtype": cc.kv_cache_dtype,
            "kv_bytes": self.num_blocks * bpb,
            "bytes_per_block": bpb,
            "kv_bytes_per_token": bpb // bs,
            "block_size": bs,
            "num_blocks": usable,
            "kv_token_capacity": usable * bs,
            "max_model_len": self.max_model_len,
            "max_concurrency": max_concurrency(usable, bs, self.max_model_len),
            "kv_pool_source": self.kv_pool_source,
            "budget_bytes": self.budget_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "reserve_bytes": self.reserve_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "cuda_graphs": self.runner.cudagraph_status,
            # compilation_config: mode, graphs, compile seconds, cache hits (workbench.compilation)
            "compilation": self.runner.compilation_status,
            # counted in reserve_bytes when the pool was sized from a budget
            "cudagraph_estimate_bytes": self.cudagraph_estimate_bytes,
            "cudagraph_bytes": self.runner.cudagraph_bytes,  # measured after the real capture
            # CPU fp32 packed GEMM weights; counted in reserve_bytes when sized from a budget
            "packed_weight_bytes": self.packed_weight_bytes,
            # CPU fp32: the linear backend per weight shape and row count, and where it came
            # from (autotuned now / cache / forced); rank 0's shards (layers.linear_autotune)
            "linear_backends": linear_backend_report(
                *[r.model for r in (self.runner, self.runner.draft_runner) if r is not None]),
            # CPU: 2 MB pages for the KV cache and torch's large buffers (worker.hugepages)
            "huge_pages": (hugepages.status() if self.runner.device.type == "cpu"
                           else "n/a (not a CPU run)"),
            # CPU: whether the forward's OpenMP threads are pinned (worker.cpu_threads)
            "cpu_threads": (cpu_threads.status() if self.runner.device.type == "cpu"
                            else "n/a (not a CPU run)"),
        }

    # ----------------------------------------------------------------- intake
    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self.tokenize(prompt["prompt"])
            raise ValueError(
                f"prompt dict keys ({sorted(prompt)}) must include 'prompt' or 'prompt_token_ids'"
            )
        if isinstance(prompt, list | tuple):
            return None, _token_ids(prompt)
        raise ValueError(
            f"prompt of type {type(prompt).__name__} is not allowed; pass a str, a list of "
            "token ids or {'prompt_token_ids': [...]}"
        )

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
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params ({params!r}) must be a SamplingParams")
        _, ids = self.tokenize(prompt)
        if not ids:
            raise ValueError("prompt is empty; at least one token is required")
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"prompt (length {len(ids)}) is longer than max_model_len ({self.max_model_len})"
                "; shorten it or raise max_model_len"
            )
        for i, t in enumerate(ids):
            if not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"prompt_token_ids[{i}] ({t}) is out of range; allowed "
                    f"0..{self.vocab_size - 1} (the model's vocabulary)"
                )
        params.check_token_ids(self.vocab_size)
        handshake = kv_transfer_params(params.extra_args)
        if handshake:
            connector = self.scheduler.connector
            if connector is not None:
                connector.check_request(handshake, params.n)
            elif handshake.get("do_remote_decode") or handshake.get("do_remote_prefill"):
                raise ValueError("kv_transfer_params do_remote_decode / do_remote_prefill "
                                 "need an engine with a kv_transfer_config (kv_connector "
                                 "'P2pConnector'); this one has none")
        max_seqs = self.config.scheduler_config.max_num_seqs
        if params.n > max_seqs:
            raise ValueError(
                f"n ({params.n}) must be <= max_num_seqs ({max_seqs}): every sequence of a "
                "request runs as one scheduled sequence"
            )
        if not is_int(priority):
            raise ValueError(f"priority ({priority!r}) must be an integer")
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise ValueError(f"cache_salt ({cache_salt!r}) must be a string or None")
        if arrival_time is not None and not (
            isinstance(arrival_time, int | float) and math.isfinite(arrival_time)
        ):
            raise ValueError(f"arrival_time ({arrival_time!r}) must be a finite number")
        rid = request_id if request_id is not None else str(next(self._ids))
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"request_id ({rid!r}) must be a non-empty string")
        return Request(
            request_id=rid, prompt_token_ids=ids, sampling_params=params,
            eos_token_id=self.eos_token_id, arrival_time=arrival_time, priority=priority,
            cache_salt=cache_salt,
        )

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
        """One iteration. Returns the requests that received tokens (finished ones too).

        Failures stay with the requests they belong to (vLLM stops the whole engine on an
        engine-core error; this engine does not):
        - a request whose own sampling or update raises finishes alone with
          FINISHED_ERROR (finish_reason "error", `request.error` says why, blocks freed);
          every other request of the step gets its tokens as if it were not there;
        - when the batched forward raises, the step's requests are run one by one to find
          the one the failure belongs to (`_execute_one_by_one`); if that blames nobody,
          every request scheduled in this step finishes with FINISHED_ERROR, the
          prefix-cache keys of blocks this step may have left half-written are dropped, and
          the engine serves the next step. With tensor parallelism the executor has
          stopped every rank by then, so the error is raised (the engine is done, as vLLM's);
          `LLM.generate` and `AsyncEngine` take the requests out;
        - a failing speculative proposer costs only this step's drafts (lossless).
        Failed requests are returned like finished ones; `errors` keeps the newest records.
        """
        t0 = time.perf_counter()
        sched = self.scheduler
        failed: dict[str, str] = {}
        progressed: list[Request] = []
        finished: list[Request] = []
        with profiling.range("engine.step"):
            with profiling.range("scheduler.schedule"):
                out = sched.schedule()
            t_scheduled = time.perf_counter()
            taint: dict[str, int] = {}  # failed in the forward: id -> tokens with valid KV
            output: ModelRunnerOutput | None
            sampled: dict[str, list[int]] | None = None
            try:
                output = self.runner.execute_model(out, failed)
            except Exception as e:  # noqa: BLE001 - fails this step's requests, not the engine
                if self.config.parallel_config.tensor_parallel_size > 1:
                    raise  # the executor has stopped every rank: this engine is done (vLLM's)
                if sched.connector is not None:
                    sched.connector.step_failed()
                output = self._execute_one_by_one(out, failed, taint, e)
                if output is None:
                    progressed = self._fail_step(out, e)
            t_executed = time.perf_counter()
            if output is not None and output.kv_connector_output is not None:
                self._kv_transfer_done(output.kv_connector_output)
            if output is not None:
                sampled = output.sampled_token_ids
                if output.prompt_logprobs:
                    self._add_prompt_logprobs(out, output.prompt_logprobs, failed)
                with profiling.range("scheduler.update"):
                    progressed, finished = sched.update_from_output(out, sampled, failed)
                if failed:
                    errored = self._fail_requests(failed, "request", taint)
                    progressed.extend(errored)
                if output.spec_token_ids:  # the worker's drafts, for requests still running
                    sched.update_draft_token_ids(output.spec_token_ids, output.spec_token_probs)
                if output.spec_decode_error is not None:
                    self.errors.append({
                        "step": self.stats.num_steps, "scope": "propose", "request_ids": [],
                        "message": output.spec_decode_error,
                    })
        stats = self.stats
        spec_drafted = spec_accepted = 0
        for rid, drafts in out.scheduled_spec_decode_tokens.items():
            tokens = sampled.get(rid) if sampled is not None else None
            if not tokens:  # its request failed
                continue
            accepted = len(tokens) - 1
            stats.record_spec(len(drafts), accepted)
            spec_drafted += len(drafts)
            spec_accepted += accepted
        c = self.stats.counters
        if sampled is not None:
            c["vllm:generation_tokens"] += sched.num_generated_last_step
            c["vllm:prompt_tokens"] += sched.num_prompt_tokens_last_step
        for req in finished:
            stats.record_finished(req.status.finish_reason)
        c["vllm:request_success"] += len(finished)
        queries, hits = sched.kv_cache_manager.make_prefix_cache_stats()
        c["vllm:prefix_cache_queries"] += queries
        c["vllm:prefix_cache_hits"] += hits
        if sched.connector is not None:
            for name, value in sched.connector.make_stats().items():
                c[name] = c.get(name, 0) + value
            g = self.stats.gauges
            g["workbench:num_requests_waiting_for_kv"] = len(sched.loading)
            g["workbench:kv_offload_cpu_usage_perc"] = sched.connector.host_usage
        t1 = time.perf_counter()
        self.stats.record_step(StepRecord(
            step=self.stats.num_steps, wall_time_s=t1, duration_s=t1 - t0,
            **_step_account(t0, t_scheduled, t_executed, t1, output),
            prefill_tokens=out.num_prefill_tokens, decode_tokens=out.num_decode_tokens,
            running=len(sched.running), waiting=len(sched.waiting),
            kv_cache_usage_perc=sched.kv_cache_manager.usage,
            preemptions=sched.num_preemptions_last_step,
            spec_draft_tokens=spec_drafted, spec_accepted_tokens=spec_accepted,
            **self._kv_step_fields(output),
        ))
        if out.preempted_request_ids:
            preemption_warning(out.preempted_request_ids, int(c["vllm:num_preemptions"]),
                               "swap" if sched.swap else "recompute")
        if self.stat_logger is not None:
            self.stat_logger.observe(self.stats)
        return progressed

    def _kv_step_fields(self, output: ModelRunnerOutput | None) -> dict[str, int]:
        """The step trace's KV connector columns (none without a connector)."""
        if self.scheduler.connector is None:
            return {}
        kv_out = output.kv_connector_output if output is not None else None
        st = kv_out.stats if kv_out is not None else None
        return {"waiting_for_kv": len(self.scheduler.loading),
                "kv_load_bytes": st.load_bytes if st else 0,
                "kv_store_bytes": (st.store_bytes + st.swap_out_bytes) if st else 0}

    def kv_transfer_info(self) -> dict[str, Any] | None:
        """The KV connector's side channel (disaggregation), None without one."""
        conn = self.scheduler.connector
        return conn.transfer_info() if conn is not None else None

    def _kv_transfer_done(self, kv_out: KVConnectorOutput) -> None:
        """The worker's KV connector report: finished loads resume their requests, failed
        ones recompute (recorded in `errors`, scope "kv_transfer"); counters."""
        self.scheduler.update_from_kv_xfer_finished(kv_out)
        self.stats.gauges["workbench:kv_transfer_held_requests"] = len(self.scheduler.sending)
        st, c = kv_out.stats, self.stats.counters
        for name, value in (
            ("vllm:kv_offload_load_bytes", st.load_bytes),
            ("vllm:kv_offload_load_time", st.load_time_s),
            ("vllm:kv_offload_store_bytes", st.store_bytes),
            ("vllm:kv_offload_store_time", st.store_time_s),
            ("vllm:kv_offload_tiering_read_bytes", st.disk_read_bytes),
            ("vllm:kv_offload_tiering_read_time", st.disk_read_time_s),
            ("workbench:kv_offload_tiering_write_bytes", st.disk_write_bytes),
            ("workbench:kv_offload_tiering_failed_writes", st.failed_disk_writes),
            ("workbench:kv_offload_tiering_bad_files", st.disk_bad_files),
            ("workbench:kv_offload_tiering_pruned_files", st.disk_pruned_files),
            ("workbench:kv_swap_out_bytes", st.swap_out_bytes),
            ("workbench:kv_swap_out_time", st.swap_out_time_s),
            ("workbench:kv_transfer_recv_bytes", st.recv_bytes),
            ("workbench:kv_transfer_recv_time", st.recv_time_s),
            ("workbench:kv_transfer_send_bytes", st.send_bytes),
            ("workbench:kv_transfer_send_time", st.send_time_s),
            ("workbench:kv_transfer_expired_sends", st.expired_sends),
            ("workbench:kv_transfer_sends", st.sends),
            ("workbench:kv_transfer_send_wait_time", st.send_wait_s),
            ("workbench:kv_transfer_stage_bytes", st.stage_bytes),
            ("workbench:kv_transfer_stage_time", st.stage_time_s),
            ("workbench:kv_transfer_push_bytes", st.push_bytes),
            ("workbench:kv_transfer_push_time", st.push_time_s),
            ("workbench:kv_transfer_push_drops", st.push_drops),
            ("workbench:kv_transfer_pushed_loads", st.pushed_loads),
        ):
            c[name] += value
        if kv_out.errors:
            for msg in kv_out.errors:
                logger.warning("KV transfer: %s (the request recomputes)", msg)
            self.errors.append({
                "step": self.stats.num_steps, "scope": "kv_transfer",
                "request_ids": sorted(kv_out.failed_recving), "message": kv_out.errors[0],
            })

    # ---------------------------------------------------------------- failures
    def _fail_requests(
        self, errors: dict[str, str], scope: str, num_valid_tokens: dict[str, int] | None = None
    ) -> list[Request]:
        """Finish `errors`' requests with FINISHED_ERROR (blocks freed), count and log them."""
        now = time.perf_counter()
        done = self.scheduler.finish_requests(
            list(errors), RequestStatus.FINISHED_ERROR, errors, num_valid_tokens
        )
        for req in done:
            req.times.finished = req.times.finished or now
            req.prompt_logprobs = []  # nothing half-built survives a failure
            self.stats.record_finished("error")
            logger.warning("request %s failed (%s): %s", req.request_id, scope, req.error)
        self.errors.append({
            "step": self.stats.num_steps, "scope": scope,
            "request_ids": [r.request_id for r in done],
            "message": next(iter(errors.values()), ""),
        })
        return done

    def _execute_one_by_one(
        self, out: SchedulerOutput, failed: dict[str, str], taint: dict[str, int],
        error: Exception,
    ) -> ModelRunnerOutput | None:
        """The batched forward raised: run each request of the step alone, in batch order
        (a prefix hit on a block its writer computes in this same step still reads it
        after the write), to find the request the failure belongs to. Those fail (in
        `failed`, with their valid-KV length in `taint`), and so does any request whose
        block table holds a block a failed one was writing; the others get their tokens.

        None when it cannot be tried or blames nobody: tensor parallelism (the ranks step
        together), a lone request, failing copy-on-write copies, or every request failing
        alone too (then the failure is the step's, not a request's).
        """
        reqs = out.scheduled_requests
        if len(reqs) < 2 or self.config.parallel_config.tensor_parallel_size > 1:
            return None
        logger.warning("the forward of step %d failed (%s: %s); running its %d requests one "
                       "by one to find the failing one", self.stats.num_steps,
                       type(error).__name__, error, len(reqs))
        try:
            if out.blocks_to_copy:  # once, before any request writes into a copied block
                self.runner.copy_blocks(out.blocks_to_copy)
        except Exception:  # noqa: BLE001 - the step's failure, not a request's
            return None
        result = ModelRunnerOutput()
        for req in reqs:
            rid = req.request_id
            spec = out.scheduled_spec_decode_tokens.get(rid)
            n = out.num_scheduled_tokens[rid]
            prefill = req.num_computed_tokens < req.num_prompt_tokens
            alone = SchedulerOutput(
                scheduled_requests=[req], num_scheduled_tokens={rid: n},
                block_ids={rid: out.block_ids[rid]},
                scheduled_spec_decode_tokens={rid: spec} if spec is not None else {},
                num_prefill_tokens=n if prefill else 0, num_decode_tokens=0 if prefill else n,
            )
            try:
                result.merge(self.runner.execute_model(alone, failed))
            except Exception as e:  # noqa: BLE001 - this request's failure
                failed[rid] = f"engine step failed: {type(e).__name__}: {e}"
                taint[rid] = req.num_computed_tokens
        if len(taint) == len(reqs):
            failed.clear()
            taint.clear()
            return None
        bs = self.config.cache_config.block_size
        unwritten = {b for rid, n in taint.items() for b in out.block_ids[rid][n // bs:]}
        for req in reqs:
            rid = req.request_id
            if rid not in taint and unwritten.intersection(out.block_ids[rid]):
                failed[rid] = ("engine step failed: it reads prefix-cache blocks that failed "
                               f"request(s) {sorted(taint)} did not write")
                taint[rid] = req.num_computed_tokens
                result.sampled_token_ids.pop(rid, None)
                result.prompt_logprobs.pop(rid, None)
        return result

    def _add_prompt_logprobs(
        self, out: SchedulerOutput, runs: dict[str, LogprobsTensors], failed: dict[str, str]
    ) -> None:
        """Hand each request its run of prompt logprobs (`Request.add_prompt_logprobs`);
        a request whose run cannot be added fails alone (in `failed`)."""
        for req in out.scheduled_requests:
            rid = req.request_id
            run = runs.get(rid)
            if run is None or rid in failed:
                continue
            try:
                req.add_prompt_logprobs(run)
            except Exception as e:  # noqa: BLE001 - this request's failure
                failed[rid] = f"prompt logprobs failed: {type(e).__name__}: {e}"

    def _fail_step(self, out: SchedulerOutput, error: Exception) -> list[Request]:
        """The batched forward raised: fail every request of the step; KV from position
        num_computed_tokens on (this step's writes) may be unwritten, so those blocks lose
        their prefix-cache keys. The engine stays usable."""
        logger.error("engine step %d failed in the forward; failing its %d requests",
                     self.stats.num_steps, len(out.scheduled_requests), exc_info=error)
        msg = f"engine step failed: {type(error).__name__}: {error}"
        reqs = out.scheduled_requests
        return self._fail_requests(
            {r.request_id: msg for r in reqs}, "step",
            {r.request_id: r.num_computed_tokens for r in reqs},
        )

    def poll_kv_transfers(self) -> None:
        """Between steps: take the KV connector's news now (a prefill instance frees the
        blocks decode instances have read since its last step; an idle engine does not
        step)."""
        worker = getattr(self.runner, "kv_connector", None)
        if worker is not None and self.scheduler.connector is not None:
            self._kv_transfer_done(worker.get_finished(set()))

    def reset_prefix_cache(self, reset_connector: bool = False) -> bool:
        """Drop the device prefix cache (False while a request holds blocks); with
        `reset_connector` (vLLM's name) the KV connector's tiers too."""
        self.poll_kv_transfers()  # blocks another instance has read since the last step
        done = self.scheduler.kv_cache_manager.reset_prefix_cache()
        connector = self.scheduler.connector
        if reset_connector and connector is not None:
            done = connector.reset_cache() and done
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


class StepAccount(TypedDict):
    """StepRecord's phase fields (seconds), see `workbench.metrics.stats.STEP_PHASES`."""

    schedule_s: float
    prepare_inputs_s: float
    forward_s: float
    sample_s: float
    update_s: float
    spec_propose_s: float
    other_s: float


def _step_account(
    t0: float, t_scheduled: float, t_executed: float, t1: float,
    output: ModelRunnerOutput | None,
) -> StepAccount:
    """A step's overhead account from the engine's boundaries: start, schedule() returned,
    execute_model returned, end; the runner's phases come from its output
    (`WorkerPhaseTimes`). `other_s` is the step minus every other phase (>= 0)."""
    w = output.phase_times if output is not None else None
    schedule, update = t_scheduled - t0, t1 - t_executed
    prepare, forward = (w.prepare_inputs_s, w.forward_s) if w else (0.0, 0.0)
    sample, propose = (w.sample_s, w.spec_propose_s) if w else (0.0, 0.0)
    other = max(0.0, (t1 - t0) - (schedule + prepare + forward + sample + update + propose))
    return StepAccount(schedule_s=schedule, prepare_inputs_s=prepare, forward_s=forward,
                       sample_s=sample, update_s=update, spec_propose_s=propose,
                       other_s=other)


def _token_ids(ids: Any) -> list[int]:
    """Prompt token ids as plain ints; anything but a sequence of integers is refused
    (int() would silently truncate 3.7 or parse "3")."""
    if not isinstance(ids, list | tuple):
        raise ValueError(f"prompt_token_ids ({ids!r}) must be a list of token ids (ints)")
    for i, t in enumerate(ids):
        if not is_int(t):
            raise ValueError(f"prompt_token_ids[{i}] ({t!r}) must be an integer token id")
    return [int(t) for t in ids]
