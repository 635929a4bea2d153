"""Micro-benchmark: scheduler + KV cache manager time per step with N running requests.

    python -m workbench.bench.micro.sched [--num-requests 256] [--steps 300]

No model: each step runs `schedule()` and `update_from_output()` with one fixed sampled token
per request, so the figure is the pure-Python engine overhead a forward pass must hide
(target: <= 0.5 ms per step at 256 running requests). Prompts are distinct (no prefix hits),
so every 16th step each request fills a block that gets hashed and cached.

The timed steps run inside `validity.CpuWatch`: the share of the CPUs other processes took is
printed, and above `--max-other-cpu-share` the figure is marked INVALID (exit 2 with --strict).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from workbench.config import CacheConfig, SchedulerConfig
from workbench.core.outputs import ModelRunnerOutput
from workbench.core.request import Request
from workbench.core.sched.output import SchedulerOutput
from workbench.core.sched.scheduler import Scheduler
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    CpuWatch,
    Validity,
    default_cpu_watch,
    disturbed_line,
)
from workbench.sampling_params import SamplingParams


def measure(
    num_requests: int = 256, prompt_len: int = 128, steps: int = 300, block_size: int = 16,
    watch: CpuWatch | None = None,
    max_other_cpu_share: float | None = DEFAULT_MAX_OTHER_CPU_SHARE,
) -> dict[str, float]:
    max_model_len = prompt_len + steps + 32
    sc = SchedulerConfig(
        max_num_seqs=num_requests, max_num_batched_tokens=max(8192, num_requests),
        max_model_len=max_model_len,
    )
    blocks = num_requests * (-(-max_model_len // block_size)) + 1
    s = Scheduler(sc, CacheConfig(block_size=block_size), blocks)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 16, ignore_eos=True)
    for i in range(num_requests):
        base = 1000 + i * prompt_len
        s.add_request(Request(f"r{i}", list(range(base, base + prompt_len)), params,
                              eos_token_id=2, arrival_time=0.0))
    while len(s.waiting):  # prefill everyone (not timed)
        out = s.schedule()
        s.update_from_output(out, _sampled(s, out))
    times = []
    with (watch or default_cpu_watch()).measure() as share:
        for _ in range(steps):
            t0 = time.perf_counter()
            out = s.schedule()
            s.update_from_output(out, _sampled(s, out))
            times.append(time.perf_counter() - t0)
            assert len(out.num_scheduled_tokens) == num_requests
    validity = Validity()
    validity.judge_cpu(share.others, max_other_cpu_share)
    times.sort()
    med = statistics.median(times)
    return {
        "num_requests": num_requests,
        "steps": steps,
        "median_ms": med * 1e3,
        "p90_ms": times[int(0.9 * len(times))] * 1e3,
        "max_ms": times[-1] * 1e3,
        "us_per_request": med * 1e6 / num_requests,
        "other_cpu_share": share.others,
        "valid": validity.valid,
    }


def _sampled(s: Scheduler, out: SchedulerOutput) -> ModelRunnerOutput:
    """One token 7 for each request whose computed tokens reach its end (a model's output)."""
    reqs = s.requests
    return ModelRunnerOutput(sampled_token_ids={
        rid: [7] for rid, n in out.num_scheduled_tokens.items()
        if reqs[rid].num_computed_tokens + n >= reqs[rid].num_tokens
    })


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-other-cpu-share", type=float, default=DEFAULT_MAX_OTHER_CPU_SHARE,
                    help="the figure is invalid when other processes used more than this "
                         "share of the CPUs meanwhile")
    ap.add_argument("--strict", action="store_true", help="exit 2 when the run was disturbed")
    args = ap.parse_args(argv)
    if not 0 <= args.max_other_cpu_share <= 1:
        ap.error(f"--max-other-cpu-share ({args.max_other_cpu_share}) must be in [0, 1]")
    r = measure(args.num_requests, args.prompt_len, args.steps,
                max_other_cpu_share=args.max_other_cpu_share)
    others = "n/a" if math.isnan(r["other_cpu_share"]) else f"{r['other_cpu_share']:.0%}"
    print("| running requests | steps | median ms/step | p90 ms/step | max ms/step | µs/request "
          "| others' CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {r['num_requests']} | {r['steps']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} | "
          f"{r['max_ms']:.3f} | {r['us_per_request']:.2f} | {others} |")
    if not r["valid"]:
        print(disturbed_line("bench sched", r["other_cpu_share"], args.max_other_cpu_share))
        if args.strict:
            sys.exit(2)
        return
    verdict = "meets" if r["median_ms"] <= 0.5 else "MISSES"
    print(f"target <= 0.5 ms per step: {verdict}")


if __name__ == "__main__":
    main()
