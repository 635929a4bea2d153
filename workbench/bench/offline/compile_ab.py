"""Compiled vs eager forward, measured: `python -m workbench.bench.offline.compile_ab`
(docs/compile.md).

    --model demo | bench | small | DIR   the demo model (6.8M), the offline bench's 30M or small
                                 checkpoint, or a folder
    starts      two fresh processes build the engine with compilation_config 3 against one
                empty cache dir (first start: inductor compiles; second: its caches hit), and
                one builds it eager: load seconds, compile seconds, graphs, FX-cache hits
    engine      one eager and one compiled engine in this process run the offline bench's
                workload (64 requests, greedy, ignore_eos; the small preset's 48 for a model
                of < 384 positions) in alternation, eager first then compiled first, so a
                neighbour's burst hits both alike: output tok/s, the median of the
                undisturbed runs; token ids compared. The pair is recorded as this
                machine's measured default for the model (`workbench.config.compile_choice`; off
                with --no-record)
    forward     runner.forward alone per batch shape (decodes of 1..64 sequences at context
                128, prefills of 128 / 512 tokens): the best of --reps calls, eager / compiled

Every timed run records the share of the CPUs other processes used (workbench.harness.validity);
a run above --max-others is redone (--retries in all) and, when still above, reported as
DISTURBED, never as a figure. The CPU model name and the date go in the header.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from workbench.platforms.cpu_info import cpu_model_name

DEMO = "demo"
BENCH = "bench"


def resolve(model: str) -> str:
    """demo, a bench preset of the offline benchmark (bench, small) or a folder -> a folder."""
    from workbench.harness.offline_workload import BENCH_MODELS

    if model in BENCH_MODELS:
        from workbench.bench.offline.throughput import BENCH_DIR
        from workbench.harness.offline_workload import build_bench_checkpoint

        preset = BENCH_MODELS[model]
        return str(build_bench_checkpoint(BENCH_DIR / preset.folder, config=preset.config))
    from workbench.config.named_models import resolve_model

    return resolve_model(model)


def max_positions(model: str) -> int:
    return int(json.loads((Path(model) / "config.json").read_text()).get(
        "max_position_embeddings", 2048))


def workload_preset(model: str) -> Any:
    """The offline bench's workload the model can hold: the bench preset's (64 requests up to
    256 + 128 tokens), or the small preset's (48 up to 128 + 64) for a model of fewer than
    384 positions."""
    from workbench.harness.offline_workload import BENCH_MODELS

    bench = BENCH_MODELS["bench"]
    longest = bench.prompt_len_range[1] + bench.output_len_range[1]
    return bench if max_positions(model) >= longest else BENCH_MODELS["small"]


# the offline bench's engine defaults
ENGINE: dict[str, Any] = {"dtype": "float32", "max_num_seqs": 64}
COMPILED: dict[str, Any] = {"mode": 3}  # the compiled side (--compiled-config)


# ---------------------------------------------------------------------------- starts
def probe_start(model: str, mode: int, cache_dir: str) -> dict[str, Any]:
    """Build one engine in this process and report what the start cost (for --probe)."""
    t0 = time.perf_counter()
    from workbench import LLM

    llm = LLM(model, compilation_config={"mode": mode, "cache_dir": cache_dir}, **ENGINE)
    load_s = time.perf_counter() - t0
    cf = llm.engine.runner.compiled_forward
    out: dict[str, Any] = {"mode": mode, "load_s": load_s}
    if cf is not None:
        st = cf.stats
        out.update(compile_s=st.compile_s, graphs=st.graphs, fx_hits=st.fx_cache_hits,
                   fx_misses=st.fx_cache_misses, fx_bypasses=st.fx_cache_bypasses,
                   kernels_built=st.kernels_built)
    return out


def measure_starts(model: str) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="compile_ab_") as cache:
        for label, mode in (("eager", 0), ("compiled, first start", 3),
                            ("compiled, second start", 3)):
            cmd = [sys.executable, "-m", "workbench.bench.offline.compile_ab", "--probe", str(mode),
                   "--model", model, "--cache-dir", cache]
            from workbench.harness.validity import default_cpu_watch

            with default_cpu_watch().measure() as share:
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row.update(start=label, others=share.others)
            rows.append(row)
            print(f"  {label:24s} load {row['load_s']:6.1f} s"
                  + (f", compile {row['compile_s']:5.1f} s ({row['graphs']} graphs, "
                     f"{row['kernels_built']} kernels built; FX cache {row['fx_hits']} hits / "
                     f"{row['fx_misses']} misses / {row['fx_bypasses']} bypasses)"
                     if "compile_s" in row else "")
                  + f"; others' CPU {share.others:.0%}", flush=True)
    return rows


# ---------------------------------------------------------------------------- timing
def alternate(fns: dict[str, Callable[[], Any]], rounds: int, max_others: float,
              retries: int) -> dict[str, list[tuple[float, float]]]:
    """(seconds, others' share) per kept run of each fn, run in alternating order."""
    from workbench.harness.validity import default_cpu_watch

    watch = default_cpu_watch()
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    names = list(fns)
    left = retries
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            while True:
                with watch.measure() as share:
                    t0 = time.perf_counter()
                    fns[name]()
                    dt = time.perf_counter() - t0
                if _undisturbed(share.others, max_others) or left <= 0:
                    break
                left -= 1
            out[name].append((dt, share.others))
    return out


def _undisturbed(share: float, max_others: float) -> bool:
    return math.isnan(share) or share <= max_others  # NaN: too short to judge, kept


def clean_median(runs: Sequence[tuple[float, float]], max_others: float) -> float | None:
    kept = [t for t, s in runs if _undisturbed(s, max_others)]
    return statistics.median(kept) if kept else None


def measure_engine(model: str, rounds: int, max_others: float, retries: int
                   ) -> dict[str, Any]:
    from workbench import LLM, SamplingParams
    from workbench.harness.offline_workload import (
        make_offline_workload,
        non_special_token_range,
        workload_tokens,
    )

    preset = workload_preset(model)
    reqs = make_offline_workload(0, num_requests=preset.num_requests,
                                 prompt_len_range=preset.prompt_len_range,
                                 output_len_range=preset.output_len_range,
                                 token_range=non_special_token_range(model))
    _, out_tokens = workload_tokens(reqs)
    prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in reqs]
    params = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
              for r in reqs]
    llms = {"eager": LLM(model, compilation_config=0, **ENGINE),
            "compiled": LLM(model, compilation_config=dict(COMPILED), **ENGINE)}
    tokens: dict[str, list[list[int]]] = {}

    def gen(name: str) -> Callable[[], None]:
        def call() -> None:
            llm = llms[name]
            llm.reset_prefix_cache()
            tokens[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)]
        return call

    for name in llms:  # one warm-up each
        gen(name)()
    runs = alternate({n: gen(n) for n in llms}, rounds, max_others, retries)
    res: dict[str, Any] = {"output_tokens": out_tokens, "equal": tokens["eager"] == tokens[
        "compiled"], "compilation": llms["compiled"].memory_readout()["compilation"]}
    for name, rs in runs.items():
        med = clean_median(rs, max_others)
        res[name] = {"tok_s": None if med is None else out_tokens / med,
                     "runs": [(out_tokens / t, s) for t, s in rs]}
    llms.clear()
    gc.collect()
    return res


def record_choice(model: str, eager_tok_s: float | None, compiled_tok_s: float | None,
                  tokens_equal: bool, compiled_slowest_tok_s: float | None = None) -> str:
    """Write the measured pair as this machine's default for the model's shape (the record
    `workbench.config.compile_choice` reads), or say why not; returns the line to print."""
    from workbench.config import compile_choice as cc

    if COMPILED != {"mode": 3}:
        return f"not recorded: the compiled side ran {json.dumps(COMPILED)}, not the default"
    if eager_tok_s is None or compiled_tok_s is None:
        return "not recorded: a side stayed disturbed"
    if not tokens_equal:
        return "not recorded: compiled tokens differ from eager (eager stays the default)"
    cfg = json.loads((Path(model) / "config.json").read_text())
    key = cc.model_key(cfg, ENGINE["dtype"])
    choice = cc.CompileChoice(eager_tok_s, compiled_tok_s, str(date.today()),
                              "python -m workbench.bench.offline.compile_ab",
                              compiled_slowest_tok_s)
    path = cc.record(key, choice)
    mode = "compiled (mode 3)" if choice.compiles else "eager"
    return f"{mode} for this model on this machine (recorded in {path})"


def _batch(runner: Any, kind: str, n: int, ctx: int, bs: int) -> Any:
    if kind == "decode":
        nb = (ctx + 1 + bs - 1) // bs
        tables = [list(range(1 + i * nb, 1 + (i + 1) * nb)) for i in range(n)]
        return runner.build_batch([7] * n, [ctx] * n, [1] * n, tables)
    return runner.build_batch([7] * n, [0], [n], [list(range(1, 2 + n // bs))])


def measure_forward(model: str, reps: int, max_others: float, retries: int
                    ) -> list[dict[str, Any]]:
    import torch

    from workbench import LLM

    llms = {"eager": LLM(model, compilation_config=0, **ENGINE),
            "compiled": LLM(model, compilation_config=dict(COMPILED), **ENGINE)}
    ctx = 128
    rows = []
    shapes = [("decode", 1), ("decode", 4), ("decode", 16), ("decode", 64), ("prefill", 128),
              ("prefill", 512)]
    longest = max_positions(model)
    for kind, n in [(k, n) for k, n in shapes if (n if k == "prefill" else ctx + 1) <= longest]:
        fns: dict[str, Callable[[], None]] = {}
        calls: dict[str, int] = {}
        for name, llm in llms.items():
            runner = llm.engine.runner
            # the batch tensors are made in inference mode, as the engine makes them (a
            # normal tensor fails the graphs' guards and recompiles)
            with torch.inference_mode():
                batch = _batch(runner, kind, n, ctx, runner.block_size)

            def call(runner: Any = runner, batch: Any = batch, name: str = name,
                     calls: dict[str, int] = calls) -> None:
                with torch.inference_mode():
                    for _ in range(calls[name]):
                        runner.forward(*batch)
            calls[name] = 3
            t0 = time.perf_counter()
            call()
            # enough calls per timing for the CPU watch to judge it (>= 0.4 s)
            calls[name] = max(reps, int(0.4 / max((time.perf_counter() - t0) / 3, 1e-6)) + 1)
            call()
            fns[name] = call
        runs = alternate(fns, 5, max_others, retries)
        row: dict[str, Any] = {"shape": f"{kind} {n}"}
        for name, rs in runs.items():
            kept = [t for t, s in rs if _undisturbed(s, max_others)]
            row[name] = min(kept) / calls[name] * 1e3 if kept else None
            row[name + "_others"] = max((s for _, s in rs if not math.isnan(s)), default=0.0)
        rows.append(row)
        e, c = row["eager"], row["compiled"]
        ratio = f"{e / c:.2f}x" if e and c else "DISTURBED"
        print(f"  {row['shape']:12s} eager {e or float('nan'):7.2f} ms   compiled "
              f"{c or float('nan'):7.2f} ms   eager/compiled {ratio}   others' CPU <= "
              f"{max(row['eager_others'], row['compiled_others']):.0%}", flush=True)
    llms.clear()
    gc.collect()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEMO, help="demo | bench | a model folder")
    ap.add_argument("--parts", default="starts,engine,forward")
    ap.add_argument("--rounds", type=int, default=4, help="engine runs per mode")
    ap.add_argument("--reps", type=int, default=20, help="forward calls per timing")
    ap.add_argument("--max-others", type=float, default=0.15)
    ap.add_argument("--retries", type=int, default=6)
    ap.add_argument("--compiled-config", type=json.loads, default=None, metavar="JSON",
                    help='the compiled side\'s compilation_config (default {"mode": 3})')
    ap.add_argument("--record", action=argparse.BooleanOptionalAction, default=True,
                    help="record the engine pair as this machine's measured default for the "
                    "model (workbench.config.compile_choice); only the default compiled config "
                    "{\"mode\": 3}, undisturbed runs and equal tokens are recorded")
    ap.add_argument("--json", default=None)
    ap.add_argument("--probe", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    model = resolve(args.model)
    if args.compiled_config is not None:
        COMPILED.clear()
        COMPILED.update(args.compiled_config)
    if args.probe is not None:
        print(json.dumps(probe_start(model, args.probe, args.cache_dir)))
        return
    import torch

    parts = set(args.parts.split(","))
    print(f"compile A/B: {args.model} ({model}); CPU {cpu_model_name()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; {date.today()}")
    result: dict[str, Any] = {"model": args.model, "cpu": cpu_model_name(),
                              "date": str(date.today()), "compiled_config": COMPILED}
    print(f"compiled side: compilation_config {json.dumps(COMPILED)}")
    if "starts" in parts:
        print("starts:", flush=True)
        result["starts"] = measure_starts(model)
    if "engine" in parts:
        print("engine (offline workload, output tok/s):", flush=True)
        eng = measure_engine(model, args.rounds, args.max_others, args.retries)
        result["engine"] = eng
        for name in ("eager", "compiled"):
            runs = ", ".join(f"{t:.0f} ({s:.0%})" for t, s in eng[name]["runs"])
            tok = eng[name]["tok_s"]
            print(f"  {name:9s} {'DISTURBED' if tok is None else f'{tok:.1f}'} tok/s; "
                  f"runs (others' CPU): {runs}")
        e, c = eng["eager"]["tok_s"], eng["compiled"]["tok_s"]
        print(f"  compiled/eager {c / e:.2f}x" if e and c else "  compiled/eager: DISTURBED",
              f"; tokens equal: {eng['equal']}; {eng['compilation']}")
        if args.record:
            slowest = min((t for t, s in eng["compiled"]["runs"]
                           if _undisturbed(s, args.max_others)), default=None)
            result["recorded"] = record_choice(model, e, c, eng["equal"], slowest)
            print(f"  default: {result['recorded']}")
    if "forward" in parts:
        print(f"forward (best of 5 x {args.reps} calls):", flush=True)
        result["forward"] = measure_forward(model, args.reps, args.max_others, args.retries)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
