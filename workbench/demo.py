"""`make demo`: generate from the bundled tiny checkpoint and print an engine report.

    python -m workbench.demo [--model DIR] [--num-requests 48] [--max-tokens 64]
                             [--num-gpu-blocks-override N] [--max-num-batched-tokens N] ...

The bundled checkpoint (`workbench/assets/tiny-llama`, random weights, built by
`tiny_checkpoint`) makes the text meaningless but exercises everything: a shared system
prompt gives prefix-cache hits, and a deliberately small KV pool forces preemptions.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from workbench import LLM, SamplingParams
from workbench.config.named_models import bundled_checkpoint
from workbench.engine.arg_utils import add_engine_args, engine_kwargs

DEMO_ENGINE_DEFAULTS = {
    "dtype": "float32", "max_model_len": 1024, "block_size": 16, "max_num_seqs": 32,
    "max_num_batched_tokens": 512, "num_gpu_blocks_override": 96,
}

SYSTEM = (
    "You are a careful serving engineer. Answer with the measured figure, the command that "
    "produced it and what it does not show. "
)
TOPICS = [
    "paged KV cache", "chunked prefill", "prefix caching", "preemption by recompute",
    "speculative decoding", "int4 weights", "tensor parallelism", "continuous batching",
]


def make_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        f"{SYSTEM}Question {i}: what does {rng.choice(TOPICS)} change for "
        f"{rng.choice(['TTFT', 'TPOT', 'throughput', 'p95 ITL'])} at concurrency "
        f"{rng.choice([1, 4, 16, 64])}?"
        for i in range(n)
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Generate and print an engine report.")
    ap.add_argument("--model", default=None, help="HF folder (default: the bundled checkpoint)")
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    # the demo's starting point: a small pool and budget so that chunking and preemption show
    add_engine_args(ap, DEMO_ENGINE_DEFAULTS)
    args = ap.parse_args(argv)
    if args.num_gpu_blocks_override == 0:  # 0: size the pool from the budget instead
        args.num_gpu_blocks_override = None

    model = Path(args.model) if args.model else bundled_checkpoint()
    t_load = time.perf_counter()
    llm = LLM(model, **engine_kwargs(args))
    load_s = time.perf_counter() - t_load
    prompts = make_prompts(args.num_requests, llm.config.model_config.seed)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens,
                            ignore_eos=True, seed=llm.config.model_config.seed
                            if args.temperature else None)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    print(format_report(llm, outs, wall, load_s, model))


def format_report(llm: LLM, outs: list, wall_s: float, load_s: float, model: Path) -> str:
    stats = llm.stats()
    trace = llm.step_trace()
    mem = llm.memory_readout()
    n_in = sum(len(o.prompt_token_ids) for o in outs)
    n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
    usage = [r["kv_cache_usage_perc"] for r in trace]
    ttft = sorted(o.metrics.time_to_first_token_s for o in outs if o.metrics)
    rows = [
        ("model", str(model)),
        ("load time", f"{load_s:.2f} s"),
        ("compilation", str(mem.get("compilation", "-"))),
        ("requests", f"{len(outs)}"),
        ("prompt tokens / output tokens", f"{n_in} / {n_out}"),
        ("wall time", f"{wall_s:.2f} s"),
        ("output tokens/s", f"{n_out / wall_s:.1f}"),
        ("total tokens/s", f"{(n_in + n_out) / wall_s:.1f}"),
        ("engine steps", f"{int(stats['num_steps'])}"),
        ("median TTFT", f"{1e3 * ttft[len(ttft) // 2]:.1f} ms" if ttft else "-"),
        ("KV usage mean / peak", f"{100 * sum(usage) / len(usage):.1f}% / {100 * max(usage):.1f}%"),
        ("prefix cache hits / queries", f"{int(stats['vllm:prefix_cache_hits'])} / "
         f"{int(stats['vllm:prefix_cache_queries'])} tokens "
         f"({100 * stats['prefix_cache_hit_rate']:.1f}%)"),
        ("preemptions", f"{int(stats['vllm:num_preemptions'])}"),
        ("weights / KV pool", f"{mem['weight_bytes'] / 2**20:.2f} MiB / "
         f"{mem['kv_bytes'] / 2**20:.2f} MiB"),
        ("KV blocks x block size", f"{mem['num_blocks']} x {mem['block_size']} = "
         f"{mem['kv_token_capacity']} tokens ({mem['bytes_per_block']} bytes/block)"),
        ("max concurrency at max_model_len", f"{mem['max_concurrency']:.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["workbench engine report", "=" * 23]
    lines += [f"{k.ljust(width)}  {v}" for k, v in rows]
    sample = outs[0].outputs[0]
    lines += ["", f"request 0 -> {sample.text[:120]!r} ({sample.finish_reason})"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
