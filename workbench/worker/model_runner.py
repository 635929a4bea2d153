"""ModelRunner: SchedulerOutput -> flat batch -> forward -> sampled token ids.

    scheduled requests  r0 (decode, 1 token) | r1 (prefill chunk, 5 tokens) | r2 (decode)
    input_ids           [t0 | t1 t2 t3 t4 t5 | t6]
    positions           [p  | c c+1 ... c+4  | q ]        c = r1.num_computed_tokens
    query_start_loc     [0, 1, 6, 7]
    slot_mapping[t]     block_table[r][pos // block_size] * block_size + pos % block_size

The runner keeps its own state per request (`request_state.CachedRequestState`, vLLM V1's),
brought to each step's message (the SchedulerOutput delta: new requests whole, then new block
ids and computed tokens) and extended with the tokens it samples; it never sees a `Request`.
The batch is gathered with numpy from the persistent `InputBatch` (`input_batch.py`, vLLM
V1's): one row per scheduled request kept across steps, so a step copies only each request's
new tokens and new block ids, not its history.

Only requests whose computed tokens reach their end this step are sampled (a prefill's last
chunk emits the first output token; a middle chunk emits nothing). The sampler gets their
`SamplingMetadata` (`sampling_metadata_builder.py`), not the requests. With speculative
decoding the runner owns the proposer (`drafter`, a `spec_decode.proposer.Proposer`) and
drafts right after sampling (`drafting.py`); the drafts ride back in
`ModelRunnerOutput.spec_token_ids`.

KV compression (kv_compression_config, docs/kv_compression.md): a request whose table lost
blocks from the middle keeps logical positions, and its seq_len and slot mapping count kept
tokens only (`input_batch.py`); score-based policies get attention scores back
(`kv_scores.py`, `ModelRunnerOutput.kv_block_scores`).

KV cache dtype: the model dtype, or float8_e4m3fn with kv_cache_dtype="fp8" (one
`KVCacheScales` per layer, bound to its cache tensor; see workbench.attention.metadata), or
KIVI's int8 / int4 / int2 blocks with a full-precision residual pool (kv_cache_dtype "int8" /
"int4" / "int2"; `workbench.attention.kivi_cache`: per-layer handles, one `kivi_map`).
`profile_run` measures the activation peak of a dummy forward for the memory budget
(`memory_profile.py`).

Tensor parallelism (`tensor_parallel_size` > 1): the model is built as this process's TP rank
(its shard of every layer) and the KV cache holds this rank's KV heads
(`kv_cache.utils.tp_kv_heads_per_rank`), so `bytes_per_block` is per rank; block ids are the same on
every rank. The ranks are started by `workbench.executor.tp_model_runner.create_model_runner`.
"""

from __future__ import annotations

import numpy as np
import torch

from workbench.attention.kivi_cache import (
    KiviLayout,
    KiviResidualMap,
    allocate_kivi_caches,
)
from workbench.attention.metadata import (
    FP8_KV_DTYPE,
    AttentionMetadata,
    KVCacheScales,
    attach_kv_scales,
)
from workbench.compilation import CompiledForward
from workbench.config import EngineConfig
from workbench.core.kv_cache.utils import (
    cdiv,
    kivi_bits,
    kivi_residual_bytes,
    kivi_residual_slots,
    kv_bytes_per_block,
    kv_cache_dtype_bytes,
    tp_kv_heads_per_rank,
)
from workbench.core.outputs import ModelRunnerOutput, WorkerPhaseTimes
from workbench.core.sched.output import SchedulerOutput
from workbench.distributed.kv_transfer.base import KVConnectorBase_V1, KVConnectorRole
from workbench.distributed.kv_transfer.factory import KVConnectorFactory
from workbench.distributed.parallel_state import (
    get_tp_group,
    rank_for_tensor_parallel_size,
    tensor_parallel_scope,
)
from workbench.layers.attention import Attention
from workbench.layers.cpu_gemm import pack_linear_weights
from workbench.models.loader import load_model
from workbench.profiling import nvtx_range
from workbench.sample.sampler import Sampler
from workbench.spec_decode.draft_model import DraftModelProposer, draft_engine_config
from workbench.spec_decode.ngram import NgramProposer
from workbench.spec_decode.proposer import Proposer
from workbench.worker import cpu_threads, hugepages, kv_scores
from workbench.worker.cpu_malloc import keep_freed_memory
from workbench.worker.cuda_graph import DecodeGraphRunner, GraphFactory, cudagraph_capture_sizes
from workbench.worker.drafting import propose_drafts
from workbench.worker.input_batch import InputBatch
from workbench.worker.memory_profile import activation_peak
from workbench.worker.phase_clock import PhaseClock
from workbench.worker.prompt_logprobs import compute_prompt_logprobs
from workbench.worker.request_state import (
    CachedRequestState,
    append_sampled,
    update_request_states,
)
from workbench.worker.sampling_metadata_builder import SamplingMetadataBuilder

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(
        self, config: EngineConfig, attention_backend: str | None = None,
        is_driver_worker: bool = True,
    ) -> None:
        """`is_driver_worker` (vLLM's name): this rank samples and proposes drafts; the other
        TP ranks (workbench.worker.tp_worker) compute the logits (a collective) and stop."""
        self.config = config
        self.is_driver_worker = is_driver_worker
        self.device = torch.device(config.device)
        self.dtype = _DTYPES[config.torch_dtype_name]
        self.block_size = config.cache_config.block_size
        mc = config.model_config
        # Tensor parallelism: this rank's shard of the model and of every KV block.
        self.tp_size = config.parallel_config.tensor_parallel_size
        self.tp_rank = rank_for_tensor_parallel_size(self.tp_size)
        if self.tp_size > 1 and self.device.type == "cuda":
            self.device = get_tp_group().device  # cuda:local_rank
        self.num_layers, self.num_kv_heads, self.head_dim = (
            mc.num_layers, tp_kv_heads_per_rank(mc.num_kv_heads, self.tp_size), mc.head_dim
        )
        if self.device.type == "cpu":
            keep_freed_memory()
            cpu_threads.policy()  # a bad WORKBENCH_CPU_OMP_THREADS_BIND is refused here
            hugepages.setting()  # and a bad WORKBENCH_HUGEPAGES
        torch.manual_seed(mc.seed)
        self.attention_backend = attention_backend or config.attention_backend or "torch"
        with tensor_parallel_scope(self.tp_rank, self.tp_size):
            self.model = load_model(
                mc, self.dtype, self.device, attention_backend=self.attention_backend
            )
        # CPU fp32: MKL-packed copies of the linear weights for decode-sized batches
        self.packed_weight_bytes = pack_linear_weights(self.model)
        self.sampler = Sampler(mc.seed, self.device)
        cc = config.cache_config
        self.kv_cache_dtype = FP8_KV_DTYPE if cc.is_fp8_kv else self.dtype
        self.kv_caches: list[torch.Tensor] = []
        self.kv_scales: list[KVCacheScales] = []  # per layer; used by an fp8 cache only
        # int8 / int4 / int2 KV (KIVI): the block layout (checked now) and the residual map
        self.kivi_layout = KiviLayout(
            kivi_bits(cc.kv_cache_dtype), self.block_size, self.num_kv_heads, self.head_dim,
            cc.kv_quant_group_size or self.head_dim) if cc.is_kivi_kv else None
        self.kivi_map: KiviResidualMap | None = None
        self.num_blocks = 0
        self.graph_runner: DecodeGraphRunner | None = None
        self.cudagraph_bytes = 0  # measured after capture_model (CUDA)
        # compilation_config modes 1 / 3 (compile_model, with the KV cache); why not, if not
        self.compiled_forward: CompiledForward | None = None
        self.compile_skipped: str | None = None
        self.sampling_metadata_builder = SamplingMetadataBuilder(self.device)
        # This worker's state of every request it holds (until finished_req_ids drops it).
        self.requests: dict[str, CachedRequestState] = {}
        # The persistent batch (rows kept across steps); it grows past these sizes if needed.
        sc = config.scheduler_config
        self.input_batch = InputBatch(sc.max_num_seqs, sc.max_model_len, self.block_size)
        # The worker side of the KV connector (kv_transfer_config), made with the KV cache.
        self.kv_connector: KVConnectorBase_V1 | None = None
        # Speculative decoding: the proposer runs after sampling in execute_model; a draft
        # model has its own runner, whose KV blocks share the target's block ids.
        self.drafter: Proposer | None = None
        self.draft_runner: ModelRunner | None = None
        spec = config.speculative_config
        if spec is not None and is_driver_worker:
            assert not isinstance(spec, dict) and mc.max_model_len is not None
            if spec.method == "ngram":
                self.drafter = NgramProposer(spec, mc.max_model_len)
            else:
                self.draft_runner = ModelRunner(draft_engine_config(config))
                self.drafter = DraftModelProposer(config, self.draft_runner)

    # ------------------------------------------------------------ cuda graphs
    @property
    def use_cuda_graphs(self) -> bool:
        """CUDA, enforce_eager off, and an attention backend whose decode path is capturable."""
        return (
            self.device.type == "cuda"
            and not self.config.enforce_eager
            and self.model.attn_backend.cudagraph_safe
            and self.kivi_layout is None  # KIVI writes are planned on the host
        )

    @property
    def cudagraph_status(self) -> str:
        if self.graph_runner is not None:
            sizes = self.graph_runner.capture_sizes
            return f"on ({len(sizes)} decode sizes {sizes[0]}..{sizes[-1]})"
        if self.device.type != "cuda":
            return "off (CPU)"
        if self.config.enforce_eager:
            return "off (enforce_eager=True)"
        if not self.model.attn_backend.cudagraph_safe:
            return f"off (attention_backend={self.attention_backend!r} plans on the host)"
        if self.kivi_layout is not None:
            return "off (a KIVI KV cache plans its writes on the host)"
        return "off (not captured yet)"

    @property
    def compilation_status(self) -> str:
        why = self.config.compilation_default  # set when the mode was a default
        if self.compiled_forward is not None:
            default = f"; default: {why}" if why else ""
            return f"on ({self.compiled_forward.stats.describe()}{default})"
        if self.compile_skipped is not None:
            return f"off ({self.compile_skipped})"
        if self.config.enforce_eager:
            return "off (enforce_eager=True)"
        return f"off (mode 0: eager; default: {why})" if why else "off (mode 0: eager)"

    def compile_model(self) -> None:
        """torch.compile the model forward (compilation_config mode 1 / 3) and, mode 3, compile
        its graphs now on the bound KV cache (workbench.compilation; docs/compile.md)."""
        cc = self.config.compilation
        if not cc.compiles or self.compiled_forward is not None:
            return
        if getattr(getattr(self.model, "model", None), "layer_hook", None) is not None:
            self.compile_skipped = "a layerwise KV connector saves from inside the forward"
            return
        if self.kivi_layout is not None:
            self.compile_skipped = "a KIVI KV cache plans its writes on the host"
            return
        self.compiled_forward = CompiledForward(self.model, cc, self.device)
        self.packed_weight_bytes -= self.compiled_forward.freed_packed_bytes
        max_tokens = self.config.scheduler_config.max_num_batched_tokens
        assert max_tokens is not None
        self.compiled_forward.warm_up(max_tokens)

    def capture_model(self, graph_factory: GraphFactory | None = None) -> None:
        """Capture decode graphs for every capture size on the bound KV cache (vLLM's name).
        FP8 scale calibration needs host syncs, so it is held off during capture and its flags
        restored after. `graph_factory` lets CPU tests substitute `EagerReplay`."""
        if not self.kv_caches:
            raise RuntimeError("capture_model needs the KV cache: call allocate_kv_cache first")
        sc = self.config.scheduler_config
        max_len = self.config.model_config.max_model_len
        assert max_len is not None
        runner = DecodeGraphRunner(
            self.compiled_forward or self.model, cudagraph_capture_sizes(sc.max_num_seqs),
            max_len, self.block_size, self.device, graph_factory,
        )
        calibrating = [s.calibrate for s in self.kv_scales]
        for s in self.kv_scales:
            s.calibrate = False
        cuda = self.device.type == "cuda"
        before = torch.cuda.memory_reserved(self.device) if cuda else 0
        try:
            with torch.inference_mode(), nvtx_range("model_runner.capture_model"):
                runner.capture()
        finally:
            for s, flag in zip(self.kv_scales, calibrating, strict=True):
                s.calibrate = flag
        if cuda:
            torch.cuda.synchronize(self.device)
            self.cudagraph_bytes = torch.cuda.memory_reserved(self.device) - before
        self.graph_runner = runner

    @torch.inference_mode()
    def profile_cudagraph_memory(self) -> int:
        """Bytes one capture of the largest decode size takes on CUDA (0 when graphs are off),
        measured on a temporary one-request KV cache before the pool is sized; smaller sizes
        share its pool, so the budget reserves this for the whole set."""
        if not self.use_cuda_graphs:
            return 0
        max_len = self.config.model_config.max_model_len
        assert max_len is not None
        self.allocate_kv_cache(cdiv(max_len, self.block_size) + 1, calibrate=False)
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        try:
            sizes = cudagraph_capture_sizes(self.config.scheduler_config.max_num_seqs)
            runner = DecodeGraphRunner(
                self.model, sizes[-1:], max_len, self.block_size, self.device
            )
            runner.capture()
            torch.cuda.synchronize(self.device)
            used = torch.cuda.memory_reserved(self.device) - before
            del runner
        finally:
            self.unbind_kv_cache()
            torch.cuda.empty_cache()
        return int(used)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV cache, then capture decode graphs when they are on; a draft model
        gets as many blocks (the same block ids)."""
        self.allocate_kv_cache(num_blocks)
        if self.config.kv_transfer_config is not None and self.kivi_layout is not None:
            raise ValueError(f"kv_transfer_config cannot move a KIVI KV cache (kv_cache_dtype="
                             f"{self.config.cache_config.kv_cache_dtype!r}); use auto or fp8")
        if self.config.kv_transfer_config is not None:
            self.kv_connector = KVConnectorFactory.create_connector(
                self.config, KVConnectorRole.WORKER, self.bytes_per_block)
            assert self.kv_connector is not None
            self.kv_connector.register_kv_caches(self.kv_caches)
            if self.kv_connector.saves_layerwise:  # save_kv_layer from inside the forward
                inner = getattr(self.model, "model", None)
                if inner is None or not hasattr(inner, "layer_hook"):
                    raise ValueError("kv_transfer_config layerwise needs a model with a layer "
                                     "hook (workbench.models.llama)")
                connector = self.kv_connector
                inner.layer_hook = lambda i: connector.save_kv_layer(i, self.kv_caches[i])
        self.compile_model()  # before capture: the decode graphs capture the compiled forward
        if self.use_cuda_graphs:
            self.capture_model()
        if self.draft_runner is not None:
            self.draft_runner.allocate_kv_cache(num_blocks)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """The model forward: a graph replay for a decode-only batch that fits one, else the
        compiled forward (compilation_config), else eager."""
        gr = self.graph_runner
        if (gr is not None and gr.can_run(meta, input_ids.shape[0])
                and meta.kv_scores is None and meta.layer_metadata is None):  # KV compression
            return gr.run(input_ids, positions, meta)
        if self.compiled_forward is not None:
            return self.compiled_forward(input_ids, positions, meta)
        return self.model(input_ids, positions, meta)

    # ----------------------------------------------------------------- memory
    @property
    def weight_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for p in list(self.model.parameters()) + list(self.model.buffers()):
            if p.data_ptr() in seen:
                continue  # tied embeddings count once
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
        return total

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block over all layers (1 byte per element for an fp8 cache; KIVI:
        codes + scales + zeros, `KiviLayout.block_bytes`; its residual pool is
        `kv_residual_bytes`, a fixed cost)."""
        if self.kivi_layout is not None:
            return self.num_layers * self.kivi_layout.block_bytes()
        dtype_bytes = kv_cache_dtype_bytes(
            self.config.cache_config.kv_cache_dtype,
            torch.empty((), dtype=self.dtype).element_size(),
        )
        return kv_bytes_per_block(
            self.num_layers, self.num_kv_heads, self.head_dim, dtype_bytes, self.block_size
        )

    @property
    def kivi_residual_slots(self) -> int:
        """Blocks of the KIVI residual pool (0 without a KIVI cache)."""
        if self.kivi_layout is None:
            return 0
        return kivi_residual_slots(self.config.scheduler_config.max_num_seqs,
                                   self.config.cache_config.kivi_residual_tokens, self.block_size)

    @property
    def kv_residual_bytes(self) -> int:
        """Bytes of the KIVI full-precision residual pool over all layers (0 without one)."""
        if self.kivi_layout is None:
            return 0
        return kivi_residual_bytes(
            self.num_layers, self.num_kv_heads, self.head_dim,
            torch.empty((), dtype=self.dtype).element_size(), self.block_size,
            self.kivi_residual_slots)

    def allocate_kv_cache(self, num_blocks: int, calibrate: bool | None = None) -> None:
        """One [2, num_blocks, block_size, Hkv, D] cache per layer, in the KV cache dtype;
        an fp8 cache gets fresh per-layer scales (1.0; calibrated on the first forward when
        calculate_kv_scales, or `calibrate`, says so)."""
        self.graph_runner = None  # graphs captured on a previous cache would write into it
        if self.kivi_layout is not None:
            self.kv_caches, self.kivi_map = allocate_kivi_caches(
                self.num_layers, num_blocks, self.kivi_layout, self.kivi_residual_slots,
                self.config.cache_config.kivi_residual_tokens, self.dtype, self.device,
                hugepages.zeros)
            self.kv_scales, self.num_blocks = [], num_blocks
            self.model.bind_kv_cache(self.kv_caches)
            return
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        if calibrate is None:
            calibrate = self.config.cache_config.calculate_kv_scales
        self.kv_caches = [  # huge pages on CPU: decode reads it in scattered blocks
            hugepages.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
            for _ in range(self.num_layers)
        ]
        self.kv_scales = [KVCacheScales(calibrate=calibrate) for _ in range(self.num_layers)]
        if self.kv_cache_dtype == FP8_KV_DTYPE:
            for cache, scales in zip(self.kv_caches, self.kv_scales, strict=True):
                attach_kv_scales(cache, scales)
        self.num_blocks = num_blocks
        self.model.bind_kv_cache(self.kv_caches)

    def unbind_kv_cache(self) -> None:
        self.kv_caches, self.kv_scales, self.num_blocks = [], [], 0
        self.kivi_map = None
        self.graph_runner = None  # its graphs point at the old cache
        for m in self.model.modules():
            if isinstance(m, Attention):
                m.kv_cache = torch.tensor([])

    def shutdown(self) -> None:
        """Release what outlives the model (the KV connector's threads); the tensor-parallel
        runners stop their ranks (workbench.executor.tp_model_runner)."""
        if self.kv_connector is not None:
            self.kv_connector.shutdown()

    @torch.inference_mode()
    def profile_run(self, num_tokens: int, max_num_seqs: int) -> int:
        """Activation peak (bytes) of one dummy forward of `num_tokens` tokens, vLLM-style
        (`memory_profile.activation_peak`). Must run before allocate_kv_cache."""
        return activation_peak(self, num_tokens, max_num_seqs)

    # ---------------------------------------------------------------- execute
    @torch.inference_mode()
    def execute_model(
        self, out: SchedulerOutput, failed: dict[str, str] | None = None
    ) -> ModelRunnerOutput:
        """The step's forward and sampling (request id -> accepted token ids), then the
        drafts for the next step when speculating (`workbench.worker.drafting`). With
        `failed`, a request whose own sampling raises is recorded there (id -> message) and
        left out of the result; an error in the batched forward raises (nobody can be
        blamed); a failing proposer costs only the drafts (`spec_decode_error`)."""
        if self.device.type == "cpu":  # once per calling thread (worker.cpu_threads)
            cpu_threads.bind_this_thread(torch.get_num_threads(), self.tp_size)
        reqs = self._update_states(out)
        connector = self.kv_connector if out.kv_connector_metadata is not None else None
        if connector is not None:  # swap-outs, then loads on the connector's thread
            assert out.kv_connector_metadata is not None
            connector.bind_connector_metadata(out.kv_connector_metadata)
            with nvtx_range("kv_connector.start_load_kv"):
                connector.start_load_kv()
        try:
            output = self._forward_and_sample(out, reqs, failed)
            if connector is not None:
                with nvtx_range("kv_connector.wait_for_save"):
                    if not connector.saves_layerwise:  # else called inside the forward
                        for layer, cache in enumerate(self.kv_caches):
                            connector.save_kv_layer(layer, cache)
                    connector.wait_for_save()
        finally:
            if connector is not None:
                connector.clear_connector_metadata()
        if connector is not None:
            output.kv_connector_output = connector.get_finished(
                out.finished_req_ids, wait=out.is_empty)
        if self.drafter is not None and not out.is_empty:
            clock = PhaseClock(self.device)
            propose_drafts(self.drafter, reqs, out, output, failed)
            output.phase_times.spec_propose_s = clock.lap()
        if output.sampled_token_ids:  # last: a step that raised appended nothing
            append_sampled(self.requests, output.sampled_token_ids.items())
        return output

    def _update_states(self, out: SchedulerOutput) -> list[CachedRequestState]:
        """The request half of vLLM's `_update_states`: this worker's states brought to the
        message (`request_state.update_request_states`; a rank that does not sample takes
        the tokens it lacks from it), finished requests dropped here, in the sampling state
        and in the proposer, new and resumed ones started in the proposer. The scheduled
        states in batch order."""
        if out.finished_req_ids and self.kivi_map is not None:  # KIVI: free their slots
            for rid in out.finished_req_ids:
                if rid in self.requests:
                    self.kivi_map.release_blocks(self.requests[rid].block_ids)
        if out.finished_req_ids:  # (the input batch drops their rows when it updates)
            self.sampling_metadata_builder.remove_requests(out.finished_req_ids)
            if self.drafter is not None:
                self.drafter.remove_requests(out.finished_req_ids)
        reqs, started = update_request_states(self.requests, out, not self.is_driver_worker)
        if started and self.drafter is not None:
            self.drafter.start_requests(started)
        return reqs

    def _forward_and_sample(
        self, out: SchedulerOutput, reqs: list[CachedRequestState],
        failed: dict[str, str] | None,
    ) -> ModelRunnerOutput:
        if out.is_empty:
            self.input_batch.update_states(out, [])  # nobody scheduled: every row leaves
            return ModelRunnerOutput()
        # the step's overhead account: seconds per phase (phase_clock.py: host time on CUDA)
        clock, times = PhaseClock(self.device), WorkerPhaseTimes()
        if out.blocks_to_copy:
            self.copy_blocks(out.blocks_to_copy)
        with nvtx_range("model_runner.prepare_inputs"):
            input_ids, positions, meta, logits_idx, to_sample = self.prepare_inputs(out, reqs)
            score_request = kv_scores.attach(  # KV compression: scores, per-layer tables
                self.config.cache_config.kv_compression_config, out, reqs, meta, self.kv_caches)
        times.prepare_inputs_s = clock.lap()
        with nvtx_range(f"model_runner.forward prefill={out.num_prefill_tokens} "
                        f"decode={out.num_decode_tokens}"):
            hidden = self.forward(input_ids, positions, meta)
        times.forward_s = clock.lap()
        block_scores = kv_scores.collect(score_request, reqs)
        prompt_logprobs = (compute_prompt_logprobs(self.model, reqs, out, hidden)
                           if out.num_prefill_tokens else {})
        if not to_sample:
            times.sample_s = clock.lap()
            return ModelRunnerOutput(prompt_logprobs=prompt_logprobs, phase_times=times,
                                     kv_block_scores=block_scores)
        spec = out.scheduled_spec_decode_tokens
        with nvtx_range("model_runner.sample"):
            logits = self.model.compute_logits(hidden[logits_idx])
            if not self.is_driver_worker:  # TP ranks 1..N-1: rank 0 samples
                return ModelRunnerOutput()
            sampling_metadata = self.sampling_metadata_builder.build(
                to_sample, spec or None, failed)
            if not spec:
                tokens = self.sampler(logits, sampling_metadata, failed=failed)
                sampled = {r.req_id: [t] for r, t in zip(to_sample, tokens, strict=True)
                           if not failed or r.req_id not in failed}
            else:
                accepted = self.sampler.verify(logits, sampling_metadata, failed=failed)
                sampled = {r.req_id: a for r, a in zip(to_sample, accepted, strict=True)
                           if not failed or r.req_id not in failed}
        times.sample_s = clock.lap()
        return ModelRunnerOutput(sampled_token_ids=sampled, prompt_logprobs=prompt_logprobs,
                                 phase_times=times, kv_block_scores=block_scores)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write block copies (src, dst), in the draft model's KV cache too."""
        if self.kivi_map is not None:
            self.kivi_map.copy_blocks(pairs)
            if self.draft_runner is not None:
                self.draft_runner.copy_blocks(pairs)
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        for cache in self.kv_caches:
            if cache.dtype == FP8_KV_DTYPE:  # copy the bytes: no fp8 indexing kernels on CPU
                cache = cache.view(torch.uint8)
            cache[:, dst] = cache[:, src]
        if self.draft_runner is not None:
            self.draft_runner.copy_blocks(pairs)

    def prepare_inputs(
        self, out: SchedulerOutput, reqs: list[CachedRequestState],
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor,
               list[CachedRequestState]]:
        """The step's flat batch (input ids, positions, attention metadata), the flat rows
        whose logits are computed and the requests sampled, in batch order (`reqs`): the
        persistent batch brought to `out`, then gathered (`InputBatch.prepare`)."""
        a = self.input_batch.prepare(out, reqs)
        input_ids, positions, meta = batch_tensors(
            self.device, a.input_ids, a.positions, a.query_start_loc, a.seq_lens,
            a.block_table, a.slot_mapping, a.query_lens)
        logits_rows = torch.from_numpy(a.logits_indices).to(self.device)
        return input_ids, positions, meta, logits_rows, a.to_sample

    def build_batch(
        self,
        token_ids: list[int],
        starts: list[int],
        q_lens: list[int],
        block_ids: list[list[int]],
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat batch tensors from lists (the draft model, profile_run, benchmarks): sequence
        i brings q_lens[i] tokens (consecutive in token_ids) at positions starts[i].., its KV
        slots from block_ids[i]."""
        bs = self.block_size
        num_reqs = len(q_lens)
        total = len(token_ids)
        q_arr = np.asarray(q_lens, dtype=np.int64)
        start_arr = np.asarray(starts, dtype=np.int64)
        if len(start_arr) != num_reqs:
            raise ValueError(f"starts ({len(starts)} values) and q_lens ({num_reqs} values) "
                             "must have one value per sequence")
        seq_lens = start_arr + q_arr
        cu = np.zeros(num_reqs + 1, dtype=np.int64)
        np.cumsum(q_arr, out=cu[1:])
        req_idx = np.repeat(np.arange(num_reqs, dtype=np.int64), q_arr)
        positions = np.arange(total, dtype=np.int64) - cu[:-1][req_idx] + start_arr[req_idx]
        width = cdiv(int(seq_lens.max()), bs) if num_reqs else 0
        table = np.zeros((num_reqs, width), dtype=np.int64)
        for i, ids in enumerate(block_ids):
            k = min(len(ids), width)
            table[i, :k] = ids[:k]
        slots = table[req_idx, positions // bs] * bs + positions % bs
        return batch_tensors(self.device, np.asarray(token_ids, dtype=np.int64), positions, cu,
                             seq_lens, table, slots, list(q_lens))


def batch_tensors(
    device: torch.device, input_ids: np.ndarray, positions: np.ndarray,
    query_start_loc: np.ndarray, seq_lens: np.ndarray, block_table: np.ndarray,
    slot_mapping: np.ndarray, query_lens: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A flat batch's numpy arrays (int64, fresh: the CPU tensors share their memory) as
    input ids, positions and attention metadata on `device` (`query_lens`: the query lengths
    as a list, when the caller has them)."""
    q_lens = np.diff(query_start_loc).tolist() if query_lens is None else list(query_lens)
    seq_lens_cpu = seq_lens.tolist()
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slot_mapping).to(device),
        query_start_loc=torch.from_numpy(query_start_loc).to(device),
        seq_lens=torch.from_numpy(seq_lens).to(device),
        block_tables=torch.from_numpy(block_table).to(device),
        query_lens_cpu=q_lens,
        seq_lens_cpu=seq_lens_cpu,
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens_cpu),
    )
    return torch.from_numpy(input_ids).to(device), torch.from_numpy(positions).to(device), meta
