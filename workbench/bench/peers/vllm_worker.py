"""vLLM's offline `LLM.generate` on the bench workload: runs INSIDE `.venv-vllm`.

Started by `vllm_peer.py` as a standalone script (`.venv-vllm/bin/python vllm_worker.py ...`),
so it imports only vllm and the standard library, never `workbench` (whose dependencies live in
the other venv). Reads the workload JSON written by the driver, runs one warm-up, then `--runs`
timed runs of the whole workload with `llm.reset_prefix_cache()` before each, then the
single-request probe the same way, and writes timings and token ids as JSON.

Input JSON:  {"requests": [{"prompt_token_ids": [...], "max_tokens": n}, ...],
              "single": {"prompt_token_ids": [...], "max_tokens": n}}
Output JSON: {"load_s", "run_s": [...], "single_run_s": [...], "token_ids": [[...], ...],
              "vllm_version", "env": {...}, "others_cpu", "redone", "maps", "compilation",
              "disturbed_run_s": [...], "disturbed_single_run_s": [...],
              "run_others": [...], "single_run_others": [...]}

A timed run during which other processes (not this one nor its children, e.g. vLLM's engine
core) used more than `--max-others` of the CPUs is redone, `--retries` times at most (shared
by the workload and the single request). A run still disturbed when the retries are spent is
kept out of `run_s` / `single_run_s` (so no median the driver takes includes it) and listed
in `disturbed_run_s` / `disturbed_single_run_s`; `others_cpu` is the worst share of every
kept run, disturbed ones included, so the driver marks the configuration INVALID.
`run_others` / `single_run_others` give each kept run's share, in the order the runs ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _busy_s() -> float:
    """CPU-seconds all processes spent busy, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """CPU-seconds (utime + stime) of `root` and all its live descendants, from /proc."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(rest[1])
        cpu[int(entry)] = (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack.extend(p for p, pp in parent.items() if pp == pid)
    return total


def _compilation(llm: Any) -> str:
    """vLLM's compilation mode as it ran, after its platform adjusted it (on CPU, vLLM
    0.32 turns the default VLLM_COMPILE into DYNAMO_TRACE_ONCE with inductor). `llm` is a
    vllm.LLM: Any here, as vLLM is installed only in `.venv-vllm`."""
    try:
        cc = llm.llm_engine.vllm_config.compilation_config
        mode = getattr(cc.mode, "name", str(cc.mode))
        return f"{mode} ({cc.backend or 'default backend'})"
    except Exception as e:  # noqa: BLE001 - another vLLM version: say so, never fail the run
        return f"unknown ({type(e).__name__})"


def _maps() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return f.read().splitlines()
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--workload", required=True, help="input JSON path")
    p.add_argument("--out", required=True, help="output JSON path")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-others", type=float, default=1.0)
    p.add_argument("--retries", type=int, default=0)
    args = p.parse_args(argv)
    env = {k: os.environ.get(k, "") for k in
           ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD")}  # before vLLM

    from vllm import LLM, SamplingParams  # noqa: PLC0415 (after argparse: --help stays fast)

    with open(args.workload) as f:
        workload = json.load(f)
    requests = workload["requests"]
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in requests]
    params = [SamplingParams(temperature=0.0, max_tokens=r["max_tokens"], ignore_eos=True)
              for r in requests]

    t0 = time.perf_counter()
    kwargs = dict(model=args.model, dtype="float32", seed=0, max_num_seqs=args.max_num_seqs,
                  max_model_len=args.max_model_len, enable_prefix_caching=True)
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t0
    compilation = _compilation(llm)

    ncpu = os.cpu_count() or 1
    me = os.getpid()
    budget = {"retries": args.retries, "redone": 0}

    def timed(ps: list, sps: list) -> tuple[float, list[list[int]], float]:
        llm.reset_prefix_cache()
        busy0, own0 = _busy_s(), _tree_cpu_s(me)
        start = time.perf_counter()
        outs = llm.generate(ps, sps, use_tqdm=False)
        elapsed = time.perf_counter() - start
        others = max(0.0, (_busy_s() - busy0) - (_tree_cpu_s(me) - own0)) / (elapsed * ncpu)
        return elapsed, [list(o.outputs[0].token_ids) for o in outs], others

    def timed_runs(ps: list, sps: list) -> tuple[list[float], list[float], list[float],
                                                 list[list[int]]]:
        """(undisturbed runs' seconds, disturbed kept runs' seconds, each kept run's
        others' share, the last output)."""
        timed(ps, sps)  # warm-up
        clean: list[float] = []
        disturbed: list[float] = []
        shares: list[float] = []
        ids: list[list[int]] = []
        while len(clean) + len(disturbed) < args.runs:
            elapsed, ids, others = timed(ps, sps)
            if others > args.max_others and budget["retries"] > 0:
                budget["retries"] -= 1
                budget["redone"] += 1
                continue
            (disturbed if others > args.max_others else clean).append(elapsed)
            shares.append(others)
        return clean, disturbed, shares, ids

    run_s, disturbed_run_s, run_others, token_ids = timed_runs(prompts, params)

    single_run_s: list[float] = []
    disturbed_single_run_s: list[float] = []
    single_run_others: list[float] = []
    single_ids: list[int] = []
    if workload.get("single"):
        s = workload["single"]
        sp = [{"prompt_token_ids": s["prompt_token_ids"]}]
        ssp = [SamplingParams(temperature=0.0, max_tokens=s["max_tokens"], ignore_eos=True)]
        single_run_s, disturbed_single_run_s, single_run_others, ids = timed_runs(sp, ssp)
        single_ids = ids[0]
    others_cpu = max(run_others + single_run_others, default=0.0)

    import vllm

    result = {
        "load_s": load_s, "run_s": run_s, "single_run_s": single_run_s,
        "token_ids": token_ids, "single_token_ids": single_ids,
        "vllm_version": vllm.__version__,
        "others_cpu": others_cpu, "redone": budget["redone"],
        "disturbed_run_s": disturbed_run_s, "disturbed_single_run_s": disturbed_single_run_s,
        "run_others": run_others, "single_run_others": single_run_others,
        "env": env,
        "compilation": compilation,
        # the libraries really mapped (LD_PRELOAD can name a file the loader skipped)
        "maps": "\n".join(sorted({line.split()[-1] for line in _maps()
                                  if "libtcmalloc" in line or "libiomp5" in line})),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
