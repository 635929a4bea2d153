"""The device check: one prepared script that measures the GPU path against the hardware limit.

    python -m workbench.bench.gpu_check OUTDIR            # on a GPU machine, < 8 min on an H200
    python -m workbench.bench.gpu_check OUTDIR --quick    # tiny shapes; runs on CPU (interpreter)

writes OUTDIR/gpu_check.json and OUTDIR/gpu_check.md with five sections:

1. kernels    every Triton kernel vs its PyTorch twin on the device (max abs error vs a bound);
2. attention  paged decode attention bandwidth: K+V bytes read / kernel time, in GB/s and as a
              fraction of the device's HBM bandwidth, at context 1k/4k/16k/32k, batch 1 and 64
              (a Llama-3-8B layer: 32 query heads, 8 KV heads, head_dim 128, block 16);
              target >= 70% at 8k+ context;
3. step       decode step time vs the roofline (weight bytes + KV bytes read) / HBM bandwidth for
              a ~0.5B-parameter Qwen2.5-shaped random model in bf16, batch 1/16/64, CUDA graphs
              on and off. "forward" is the model forward of a decode-only step on the GPU stream
              (CUDA events around ModelRunner.forward: graph replay or eager launches); "step" is
              the whole engine step (scheduler, input prep, sampling) on the host clock;
              target: batch-1 forward with graphs <= 1.25x the roofline;
4. throughput the engine vs transformers `generate` (static left-padded batches) and
              `generate_batch` (continuous batching) on the same greedy workload;
5. kv_offload the OffloadingConnector's copy path (pinned host tier; PCIe/NVLink DMA on a
              GPU): greedy tokens with the tier equal the recompute run, load/store GB/s.
6. pd_disagg  the P2pConnector: a prefill engine and a decode engine on the device, the KV read
              over ZeroMQ (device -> host -> wire -> host -> device; NIXL would read device
              memory directly): greedy tokens equal a colocated engine, transfer GB/s.

Every section runs inside its own try block: a failure is recorded in the report with its
traceback and the other sections still run. The HBM bandwidth comes from the device name
(`HBM_BYTES_PER_S`) or --hbm-gbps. Nothing here imports the server or MLflow, so it runs on a
bare CUDA image that has torch, triton and transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# Nominal HBM bandwidth by device-name fragment (the vendor's spec sheets), first match wins.
HBM_BYTES_PER_S: list[tuple[str, float]] = [
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("H800", 3.35e12),
    ("GH200", 4.0e12),
    ("B200", 8.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("L4", 0.3e12),
    ("RTX 4090", 1.008e12),
]

# ~0.5B parameters, shaped like Qwen2.5-0.5B (tied embeddings, q/k/v bias, GQA 14:2).
QWEN25_05B: dict[str, Any] = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, head_dim=64, vocab_size=151936, max_position_embeddings=32768,
    tie_word_embeddings=True, rope_theta=1000000.0,
)
QUICK_MODEL: dict[str, Any] = dict(vocab_size=512)  # tiny_checkpoint's defaults otherwise

ATTN_SHAPE = dict(num_heads=32, num_kv_heads=8, head_dim=128, block_size=16)


def hbm_bandwidth(device_name: str) -> float | None:
    """Nominal HBM bytes/s for a device name (None when unknown)."""
    for fragment, bw in HBM_BYTES_PER_S:
        if fragment.lower() in device_name.lower():
            return bw
    return None


@dataclass
class CheckConfig:
    outdir: Path
    device: str = "cuda"
    quick: bool = False
    hbm_bytes_per_s: float | None = None
    sections: tuple[str, ...] = ("kernels", "attention", "step", "throughput", "kv_offload",
                                 "pd_disagg")
    contexts: tuple[int, ...] = (1024, 4096, 16384, 32768)
    attn_batches: tuple[int, ...] = (1, 64)
    step_batches: tuple[int, ...] = (1, 16, 64)
    step_prompt_len: int = 512
    step_output_len: int = 32
    throughput_requests: int = 64
    throughput_output_len: int = 128
    model_dir: Path | None = None  # reuse a checkpoint instead of building the 0.5B one

    def __post_init__(self) -> None:
        allowed = ("kernels", "attention", "step", "throughput", "kv_offload", "pd_disagg")
        bad = [s for s in self.sections if s not in allowed]
        if bad:
            raise ValueError(f"sections ({','.join(bad)}) unknown; allowed: {', '.join(allowed)}")
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device ({self.device!r}) must be 'cuda' or 'cpu'")
        if self.quick:  # small enough for the Triton interpreter on a CPU
            self.contexts, self.attn_batches = (48, 80), (1, 3)
            self.step_batches, self.step_prompt_len, self.step_output_len = (1, 3), 12, 4
            self.throughput_requests, self.throughput_output_len = 3, 4

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device == "cuda" else torch.float32


@dataclass
class Report:
    device_name: str
    hbm_bytes_per_s: float | None
    config: dict[str, Any]
    versions: dict[str, str]
    sections: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------- timing
def time_fn(fn: Callable[[], Any], device: str, warmup: int = 3, iters: int = 20) -> float:
    """Median seconds of fn() after warmup calls: CUDA events on the GPU (kernel time on the
    stream, the L2 flushed with a 256 MB write before each call), perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
        for _ in range(iters):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------- 1 kernels
def check_kernels(cfg: CheckConfig) -> list[dict[str, Any]]:
    """Every kernel vs its twin on the device; see kernel_cases for the shapes."""
    from workbench.bench.gpu.kernel_cases import kernel_cases

    rows = []
    for case in kernel_cases(cfg.device, cfg.dtype, quick=cfg.quick):
        got, want = case.run()
        err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
        rows.append({"kernel": case.kernel, "case": case.name, "max_abs_err": err,
                     "bound": case.bound, "ok": bool(err <= case.bound)})
    return rows


# ----------------------------------------------------------------------------- 2 attention
def decode_attention_bandwidth(cfg: CheckConfig) -> list[dict[str, Any]]:
    """Paged decode attention: bytes of K and V each sequence reads / kernel time."""
    from workbench.bench.gpu.kernel_cases import decode_attention_call

    shape = dict(ATTN_SHAPE)
    if cfg.quick:
        shape.update(num_heads=8, num_kv_heads=2, head_dim=32)
    elem = torch.empty((), dtype=cfg.dtype).element_size()
    rows = []
    for batch in cfg.attn_batches:
        for ctx in cfg.contexts:
            call = decode_attention_call(cfg.device, cfg.dtype, batch, ctx, **shape)
            seconds = time_fn(call, cfg.device, warmup=2 if cfg.quick else 5,
                              iters=2 if cfg.quick else 30)
            kv_bytes = 2 * batch * ctx * shape["num_kv_heads"] * shape["head_dim"] * elem
            gbs = kv_bytes / seconds / 1e9
            frac = kv_bytes / seconds / cfg.hbm_bytes_per_s if cfg.hbm_bytes_per_s else None
            rows.append({"batch": batch, "context": ctx, "time_us": seconds * 1e6,
                         "kv_bytes": kv_bytes, "gb_per_s": gbs, "fraction_of_hbm": frac,
                         "target_applies": ctx >= 8192,
                         "ok": None if frac is None or ctx < 8192 else frac >= 0.70})
            del call
    return rows


# ---------------------------------------------------------------------------------- model
def build_model(cfg: CheckConfig) -> Path:
    """The random ~0.5B Qwen2.5-shaped checkpoint (tiny one with --quick), built once."""
    from workbench.testing import tiny_checkpoint

    if cfg.model_dir is not None and (cfg.model_dir / "config.json").exists():
        return cfg.model_dir
    # Outside OUTDIR: the 0.5B checkpoint is 2 GB of fp32 safetensors, not a report file.
    path = cfg.model_dir or Path(tempfile.gettempdir()) / "workbench-gpu-check" / (
        "model-quick" if cfg.quick else "model-qwen25-05b")
    if (path / "config.json").exists():
        return path
    overrides = QUICK_MODEL if cfg.quick else QWEN25_05B
    return tiny_checkpoint(path, arch="qwen2", seed=0, **overrides)


def _random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(length)] for _ in range(n)]


def _engine(cfg: CheckConfig, ckpt: Path, enforce_eager: bool, max_num_seqs: int,
            max_model_len: int) -> Any:
    from workbench import LLM

    dtype = "bfloat16" if cfg.device == "cuda" else "float32"
    return LLM(str(ckpt), dtype=dtype, device=cfg.device, enforce_eager=enforce_eager,
               max_num_seqs=max_num_seqs, max_model_len=max_model_len,
               attention_backend="triton", block_size=16)


class ForwardTimer:
    """Wraps ModelRunner.forward: per call, the batch size, the summed context length and the
    time from launch to completion on the stream (CUDA events; perf_counter on CPU)."""

    def __init__(self, runner: Any, device: str) -> None:
        self.runner, self.device = runner, device
        self.original = runner.forward
        self.calls: list[tuple[int, int, bool, Any, Any]] = []
        runner.forward = self

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any) -> Any:
        decode_only = meta.max_query_len == 1
        start: torch.cuda.Event | float
        end: torch.cuda.Event | float
        if self.device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            out = self.original(input_ids, positions, meta)
            end.record()
        else:
            start = time.perf_counter()
            out = self.original(input_ids, positions, meta)
            end = time.perf_counter()
        self.calls.append((meta.num_seqs, sum(meta.seq_lens_cpu), decode_only, start, end))
        return out

    def decode_times(self, batch: int) -> list[tuple[float, int]]:
        """(seconds, summed context) of the decode-only forwards with `batch` sequences."""
        _sync(self.device)
        out = []
        for n, ctx, decode_only, start, end in self.calls:
            if decode_only and n == batch:
                s = start.elapsed_time(end) / 1e3 if self.device == "cuda" else end - start
                out.append((s, ctx))
        return out

    def restore(self) -> None:
        self.runner.forward = self.original


def decode_step_roofline(cfg: CheckConfig, ckpt: Path) -> list[dict[str, Any]]:
    from workbench import SamplingParams
    from workbench.core.kv_cache.utils import kv_bytes_per_token
    from workbench.planning import decode_step_lower_bound_s

    rows = []
    max_batch = max(cfg.step_batches)
    max_len = cfg.step_prompt_len + cfg.step_output_len + 16
    for graphs in (True, False):
        if graphs and cfg.device != "cuda":
            continue  # CUDA graphs need CUDA; the eager rows still exercise the path
        llm = _engine(cfg, ckpt, enforce_eager=not graphs, max_num_seqs=max_batch,
                      max_model_len=max_len)
        runner = llm.model_runner
        mc = llm.config.model_config
        elem = torch.empty((), dtype=runner.dtype).element_size()
        per_token = kv_bytes_per_token(mc.num_layers, mc.num_kv_heads, mc.head_dim, elem)
        vocab = int(mc.hf_config["vocab_size"])
        for batch in cfg.step_batches:
            prompts = _random_prompts(batch, cfg.step_prompt_len, vocab, seed=batch)
            params = SamplingParams(temperature=0.0, max_tokens=cfg.step_output_len,
                                    ignore_eos=True)
            llm.generate([{"prompt_token_ids": p} for p in prompts], params)  # warm-up
            llm.reset_prefix_cache()
            timer = ForwardTimer(runner, cfg.device)
            steps_before = len(llm.step_trace())
            try:
                llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            finally:
                timer.restore()
            fwd = timer.decode_times(batch)
            trace = llm.step_trace()[steps_before:]
            step_s = [r["duration_s"] for r in trace
                      if r["prefill_tokens"] == 0 and r["decode_tokens"] == batch]
            if not fwd:
                raise RuntimeError(f"no decode-only forward of batch {batch} was seen")
            fwd_s = statistics.median(s for s, _ in fwd)
            mean_ctx = statistics.mean(c for _, c in fwd)
            row: dict[str, Any] = {
                "batch": batch, "cuda_graphs": graphs, "cudagraph_status":
                runner.cudagraph_status, "forward_ms": fwd_s * 1e3,
                "engine_step_ms": statistics.median(step_s) * 1e3 if step_s else None,
                "weight_bytes": runner.weight_bytes, "kv_bytes": mean_ctx * per_token,
                "decode_forwards": len(fwd),
            }
            if cfg.hbm_bytes_per_s:
                bound = decode_step_lower_bound_s(runner.weight_bytes, mean_ctx * per_token,
                                                  cfg.hbm_bytes_per_s)
                row.update(roofline_ms=bound * 1e3, forward_over_roofline=fwd_s / bound)
                if batch == 1 and graphs:
                    row["target"] = "forward <= 1.25x roofline"
                    row["ok"] = fwd_s / bound <= 1.25
            rows.append(row)
        mem = llm.memory_readout()
        rows.append({"memory_readout": mem, "cuda_graphs": graphs})
        del llm, runner
        if cfg.device == "cuda":
            torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------- throughput
def throughput_vs_hf(cfg: CheckConfig, ckpt: Path) -> list[dict[str, Any]]:
    from workbench import SamplingParams
    from workbench.bench.peers import hf_generate as hf
    from workbench.harness.offline_workload import OfflineRequest

    cfg_json = json.loads((ckpt / "config.json").read_text())
    vocab = int(cfg_json["vocab_size"])
    rng = random.Random(0)
    lo, hi = (8, 16) if cfg.quick else (128, 512)
    reqs = [OfflineRequest(prompt_token_ids=[rng.randrange(2, vocab) for _ in
                                             range(rng.randint(lo, hi))],
                           max_tokens=cfg.throughput_output_len)
            for _ in range(cfg.throughput_requests)]
    out_tokens = sum(r.max_tokens for r in reqs)
    runs = 1 if cfg.quick else 2
    rows: list[dict[str, Any]] = []

    def timed(name: str, fn: Callable[[], list[list[int]]], notes: str) -> list[list[int]]:
        ids = fn()  # warm-up (compiles, captures, allocator)
        times = []
        for _ in range(runs):
            _sync(cfg.device)
            t0 = time.perf_counter()
            ids = fn()
            _sync(cfg.device)
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        rows.append({"system": name, "seconds": s, "output_tok_s": out_tokens / s,
                     "runs": runs, "notes": notes})
        return ids

    def engine_side() -> list[list[int]]:
        llm = _engine(cfg, ckpt, enforce_eager=False, max_num_seqs=len(reqs),
                      max_model_len=hi + cfg.throughput_output_len + 16)
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
        params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
                  for r in reqs]

        def engine_run() -> list[list[int]]:
            llm.reset_prefix_cache()
            return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]

        status = llm.memory_readout()["cuda_graphs"]
        return timed("engine", engine_run, f"attention_backend=triton, cuda graphs {status}")

    engine_ids = engine_side()
    if cfg.device == "cuda":
        torch.cuda.empty_cache()

    model = hf.load_hf_model(ckpt, dtype=cfg.dtype, device=cfg.device)
    gen_ids = timed("hf-generate", lambda: hf.generate_static(model, reqs, len(reqs)),
                    f"one left-padded batch of {len(reqs)}, sdpa")
    del model
    if cfg.device == "cuda":
        torch.cuda.empty_cache()
    model = hf.load_hf_model(ckpt, dtype=cfg.dtype, device=cfg.device)
    runner = hf.CBRunner(model, max_requests=len(reqs), max_len=hi + cfg.throughput_output_len,
                         cache_requests=len(reqs), max_batch_tokens=2048)
    runner.start()
    try:
        batch_ids = timed("hf-generate_batch", lambda: runner.run(reqs),
                          "continuous batching manager, sdpa, page 64")
    finally:
        runner.stop()
    for row, ids in zip(rows, (engine_ids, gen_ids, batch_ids), strict=True):
        row["engine_speedup"] = row["seconds"] / rows[0]["seconds"]  # this system's time / engine's
        row["requests_equal_to_engine"] = sum(a == b for a, b in zip(ids, engine_ids,
                                                                     strict=True))
    return rows


# ---------------------------------------------------------------------------------- report
def kv_offload_round_trip(cfg: CheckConfig, ckpt: Path) -> list[dict[str, Any]]:
    """The OffloadingConnector's copy path on the device: documents run one at a time through
    a device pool too small to keep them, twice; with a host tier (pinned memory on CUDA, so
    loads and stores are PCIe/NVLink DMA) the second round loads each prefix back. Greedy
    tokens must equal the run without the tier; load/store bandwidth from the counters."""
    from workbench import LLM
    from workbench.sampling_params import SamplingParams

    vocab = int(json.loads((ckpt / "config.json").read_text())["vocab_size"])
    n, length = (3, 40) if cfg.quick else (8, 1024)
    prompts = _random_prompts(n, length, vocab, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    dtype = "bfloat16" if cfg.device == "cuda" else "float32"
    blocks = 2 * -(-(length + 8) // 16) + 1  # room for two requests, never for all
    kt = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30, "block_size": 16}}
    rows: list[dict[str, Any]] = []
    outs: dict[str, list[list[int]]] = {}
    variants: tuple[tuple[str, dict[str, Any]], ...] = (
        ("recompute", {}), ("host tier", {"kv_transfer_config": kt}))
    for name, extra in variants:
        llm = LLM(str(ckpt), dtype=dtype, device=cfg.device, max_num_seqs=2,
                  max_model_len=length + 16, attention_backend="triton", block_size=16,
                  num_gpu_blocks_override=blocks, **extra)
        t0 = time.perf_counter()
        outs[name] = [list(llm.generate([p], params)[0].outputs[0].token_ids)
                      for p in prompts + prompts]
        seconds = time.perf_counter() - t0
        st = llm.stats()
        load_s, store_s = st["vllm:kv_offload_load_time"], st["vllm:kv_offload_store_time"]
        rows.append({
            "system": name, "seconds": seconds,
            "external_hit_tokens": st["vllm:external_prefix_cache_hits"],
            "load_gb_per_s": st["vllm:kv_offload_load_bytes"] / load_s / 1e9 if load_s else None,
            "store_gb_per_s": (st["vllm:kv_offload_store_bytes"] / store_s / 1e9
                               if store_s else None),
            "requests_equal_to_recompute": sum(
                a == b for a, b in zip(outs[name], outs["recompute"], strict=True)),
        })
        del llm
    rows[-1]["ok"] = (rows[-1]["requests_equal_to_recompute"] == 2 * n
                      and rows[-1]["external_hit_tokens"] > 0)
    return rows


def pd_disagg_round_trip(cfg: CheckConfig, ckpt: Path) -> list[dict[str, Any]]:
    """The P2pConnector on the device: prompts prefilled on a producer engine (max_tokens=1,
    do_remote_decode), decoded on a consumer engine that reads the held blocks; greedy
    tokens must equal a colocated engine's, and the counters give the transfer rate. The
    torch_dist row reads over a torch.distributed pair group formed by one untimed warm-up
    read (`rendezvous_s`): gloo, staged through host memory on CUDA, because both engines
    here share one GPU and NCCL cannot pair two ranks on one device (its NCCL path needs an
    instance per GPU)."""
    from workbench import LLM
    from workbench.sampling_params import SamplingParams

    vocab = int(json.loads((ckpt / "config.json").read_text())["vocab_size"])
    n, length, out_len = (3, 40, 4) if cfg.quick else (8, 2048, 16)
    prompts = _random_prompts(n, length, vocab, seed=5)
    dtype = "bfloat16" if cfg.device == "cuda" else "float32"
    kw: dict[str, Any] = {"dtype": dtype, "device": cfg.device, "max_num_seqs": n,
          "max_model_len": length + out_len + 16, "attention_backend": "triton",
          "block_size": 16, "num_gpu_blocks_override": n * -(-(length + out_len) // 16) + 8}
    greedy = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    ref_llm = LLM(str(ckpt), **kw)
    t0 = time.perf_counter()
    want = [list(o.outputs[0].token_ids) for o in ref_llm.generate(prompts, greedy)]
    colocated_s = time.perf_counter() - t0
    del ref_llm
    prefill = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                             extra_args={"kv_transfer_params": {"do_remote_decode": True}})
    rows: list[dict[str, Any]] = []
    td_mode, td = "torch_dist (gloo)", {"transport": "torch_dist", "torch_dist_backend": "gloo"}
    for mode, extra in (("hold", {}), ("layerwise", {"layerwise": True}),
                        ("push", {"layerwise": True}), (td_mode, td)):
        prod = LLM(str(ckpt), kv_transfer_config={
            "kv_connector": "P2pConnector", "kv_role": "kv_producer",
            "kv_connector_extra_config": extra}, **kw)
        cons = LLM(str(ckpt), kv_transfer_config={
            "kv_connector": "P2pConnector", "kv_role": "kv_consumer",
            "kv_connector_extra_config": td if mode == td_mode else {}}, **kw)
        before: dict[str, float] = {}
        rendezvous_s = None
        if mode == td_mode:  # the first read forms the pair's group: once, untimed
            warm = _random_prompts(1, 33, vocab, seed=6)
            kvp = prod.generate(warm, prefill)[0].kv_transfer_params
            t0 = time.perf_counter()
            cons.generate(warm, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                                               extra_args={"kv_transfer_params": kvp}))
            rendezvous_s = time.perf_counter() - t0
            before = cons.stats()
        leg = prefill
        if mode == "push":  # each staged layer sent to the consumer while prefill runs
            info = cons.engine.kv_transfer_info() or {}
            leg = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, extra_args={
                "kv_transfer_params": {"do_remote_decode": True,
                                       "remote_host": info["side_channel_host"],
                                       "remote_port": info["side_channel_port"]}})
        t0 = time.perf_counter()
        handshakes = [o.kv_transfer_params for o in prod.generate(prompts, leg)]
        prefill_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = cons.generate(prompts, [SamplingParams(
            temperature=0.0, max_tokens=out_len, ignore_eos=True,
            extra_args={"kv_transfer_params": k}) for k in handshakes])
        decode_s = time.perf_counter() - t0
        got = [list(o.outputs[0].token_ids) for o in outs]
        st, ps = cons.stats(), prod.stats()
        st = {k: v - before.get(k, 0) if k.startswith("workbench:kv_transfer_") else v
              for k, v in st.items()}  # the timed batch only (no warm-up read)
        recv_s = st["workbench:kv_transfer_recv_time"]
        row = {"mode": mode, "prompts": n, "prompt_len": length, "colocated_s": colocated_s,
               "prefill_leg_s": prefill_s, "decode_leg_s": decode_s,
               "kv_bytes": st["workbench:kv_transfer_recv_bytes"],
               "recv_gb_per_s": st["workbench:kv_transfer_recv_bytes"] / recv_s / 1e9
               if recv_s else None,
               "stage_s": ps["workbench:kv_transfer_stage_time"],
               "push_s": ps["workbench:kv_transfer_push_time"],
               "pushed_loads": st["workbench:kv_transfer_pushed_loads"],
               "failed_recvs": st["workbench:kv_transfer_failed_recvs"],
               "requests_equal_to_colocated": sum(a == b for a, b in zip(got, want,
                                                                         strict=True))}
        row["ok"] = row["requests_equal_to_colocated"] == n and row["failed_recvs"] == 0 \
            and (mode != "push" or row["pushed_loads"] == n)
        if rendezvous_s is not None:
            row["rendezvous_s"] = rendezvous_s  # the warm-up read, group formation included
        rows.append(row)
        prod.engine.shutdown()
        cons.engine.shutdown()
        del prod, cons
    return rows


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        return f"{x:.{digits}g}" if abs(x) < 1e-2 or abs(x) >= 1e5 else f"{x:.{digits}f}"
    return str(x)


def _table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return lines


def render_markdown(report: Report) -> str:
    bw = report.hbm_bytes_per_s
    lines = [f"# GPU check: {report.device_name}", "",
             f"HBM bandwidth used for the fractions: {bw / 1e12:.2f} TB/s (nominal)" if bw
             else "HBM bandwidth unknown: fractions and roofline omitted", "",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()), ""]
    s = report.sections
    if "kernels" in s:
        lines += ["## Kernels vs their PyTorch twins", ""]
        lines += _table(s["kernels"], ["kernel", "case", "max_abs_err", "bound", "ok"]) + [""]
    if "attention" in s:
        lines += ["## Paged decode attention bandwidth", "",
                  f"Shape: {ATTN_SHAPE}; bytes = K + V read. Target: >= 70% of HBM at 8k+.", ""]
        lines += _table(s["attention"], ["batch", "context", "time_us", "gb_per_s",
                                         "fraction_of_hbm", "ok"]) + [""]
    if "step" in s:
        rows = [r for r in s["step"] if "batch" in r]
        lines += ["## Decode step vs roofline (~0.5B Qwen2.5-shaped, bf16)", "",
                  "forward = model forward of a decode-only step on the GPU stream; roofline ="
                  " (weight + KV bytes) / HBM bandwidth; engine step adds scheduling, input "
                  "prep and sampling on the host. Target: batch 1 with graphs <= 1.25x.", ""]
        lines += _table(rows, ["batch", "cuda_graphs", "forward_ms", "roofline_ms",
                               "forward_over_roofline", "engine_step_ms", "ok"]) + [""]
        for r in s["step"]:
            if "memory_readout" in r:
                m = r["memory_readout"]
                lines.append(f"- memory (graphs {'on' if r['cuda_graphs'] else 'off'}): "
                             f"cuda_graphs {m.get('cuda_graphs')}, cudagraph_bytes "
                             f"{m.get('cudagraph_bytes')}, weights {m.get('weight_bytes')}, "
                             f"kv {m.get('kv_bytes')}")
        lines.append("")
    if "throughput" in s:
        lines += ["## Engine vs transformers on the GPU (same greedy workload)", ""]
        lines += _table(s["throughput"], ["system", "seconds", "output_tok_s",
                                          "engine_speedup", "requests_equal_to_engine",
                                          "notes"]) + [""]
    if "kv_offload" in s:
        lines += ["## KV offload: device -> host tier -> device (OffloadingConnector)", "",
                  "Each prompt twice through a device pool that holds two; the host tier "
                  "serves the second round. Target: every request equal, hits > 0.", ""]
        lines += _table(s["kv_offload"], ["system", "seconds", "external_hit_tokens",
                                          "load_gb_per_s", "store_gb_per_s",
                                          "requests_equal_to_recompute", "ok"]) + [""]
    if "pd_disagg" in s:
        lines += ["## Prefill/decode disaggregation (P2pConnector over ZeroMQ)", "",
                  "Prefill on one engine, KV read by a second that decodes (push: sent to it "
                  "layer by layer during the prefill). Target: every request equal to the "
                  "colocated engine, no failed read, every push used.", ""]
        lines += _table(s["pd_disagg"], ["mode", "prompts", "prompt_len", "colocated_s",
                                         "prefill_leg_s", "decode_leg_s", "kv_bytes",
                                         "recv_gb_per_s", "stage_s", "push_s", "pushed_loads",
                                         "requests_equal_to_colocated",
                                         "ok"]) + [""]
    for name, err in report.errors.items():
        lines += [f"## {name}: FAILED", "", "```", err.rstrip(), "```", ""]
    lines.append("Section wall times (s): " + ", ".join(
        f"{k} {v:.1f}" for k, v in report.seconds.items()))
    return "\n".join(lines) + "\n"


def write_report(report: Report, outdir: Path) -> tuple[Path, Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    js, md = outdir / "gpu_check.json", outdir / "gpu_check.md"
    js.write_text(json.dumps(asdict(report), indent=2, default=str))
    md.write_text(render_markdown(report))
    return js, md


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for mod in ("triton", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 (a missing package is a fact to report)
            out[mod] = "missing"
    return out


def run_check(cfg: CheckConfig) -> Report:
    name = torch.cuda.get_device_name() if cfg.device == "cuda" else "CPU (Triton interpreter)"
    bw = cfg.hbm_bytes_per_s or (hbm_bandwidth(name) if cfg.device == "cuda" else None)
    cfg.hbm_bytes_per_s = bw
    report = Report(device_name=name, hbm_bytes_per_s=bw,
                    config={k: str(v) for k, v in asdict(cfg).items()}, versions=_versions())
    ckpt: Path | None = None

    def section(key: str, fn: Callable[[], Any]) -> None:
        if key not in cfg.sections:
            return
        t0 = time.perf_counter()
        print(f"[gpu_check] {key} ...", flush=True)
        try:
            report.sections[key] = fn()
        except Exception:  # noqa: BLE001 (recorded; the other sections still run)
            report.errors[key] = traceback.format_exc()
            print(report.errors[key], file=sys.stderr, flush=True)
        report.seconds[key] = time.perf_counter() - t0
        write_report(report, cfg.outdir)  # partial results survive a later crash or timeout

    def model() -> Path:
        nonlocal ckpt
        if ckpt is None:
            ckpt = build_model(cfg)
        return ckpt

    section("kernels", lambda: check_kernels(cfg))
    section("attention", lambda: decode_attention_bandwidth(cfg))
    section("step", lambda: decode_step_roofline(cfg, model()))
    section("throughput", lambda: throughput_vs_hf(cfg, model()))
    section("kv_offload", lambda: kv_offload_round_trip(cfg, model()))
    section("pd_disagg", lambda: pd_disagg_round_trip(cfg, model()))
    return report


def parse_args(argv: Sequence[str] | None) -> CheckConfig:
    p = argparse.ArgumentParser(prog="python -m workbench.bench.gpu_check",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", type=Path, help="where gpu_check.json and gpu_check.md go")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes (CPU + Triton interpreter, or a smoke run on a GPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when available, else cpu (then --quick is implied)")
    p.add_argument("--hbm-gbps", type=float, default=None,
                   help="HBM bandwidth in GB/s (default: from the device name)")
    p.add_argument("--sections",
                   default="kernels,attention,step,throughput,kv_offload,pd_disagg")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="reuse (or build once into) this checkpoint folder")
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return CheckConfig(
        outdir=a.outdir, device=device, quick=a.quick or device == "cpu",
        hbm_bytes_per_s=a.hbm_gbps * 1e9 if a.hbm_gbps else None,
        sections=tuple(s for s in a.sections.split(",") if s), model_dir=a.model_dir,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = run_check(cfg)
    js, md = write_report(report, cfg.outdir)
    print(render_markdown(report))
    print(f"[gpu_check] wrote {js} and {md}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
