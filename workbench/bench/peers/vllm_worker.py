"""vLLM's offline `LLM.generate` on the bench workload: runs INSIDE `.venv-vllm`.

Started by `vllm_peer.py` as a standalone script (`.venv-vllm/bin/python vllm_worker.py ...`),
so it imports only vllm and the standard library, never `workbench` (whose dependencies live in
the other venv). Reads the workload JSON written by the driver, runs one warm-up, then `--runs`
timed runs of the whole workload with `llm.reset_prefix_cache()` before each, then the
single-request probe the same way, and writes timings and token ids as JSON.

Input JSON:  {"requests": [{"prompt_token_ids": [...], "max_tokens": n}, ...],
              "single": {"prompt_token_ids": [...], "max_tokens": n}}
Output JSON: {"load_s", "run_s": [...], "single_run_s": [...], "token_ids": [[...], ...],
              "vllm_version", "env": {...}}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--workload", required=True, help="input JSON path")
    p.add_argument("--out", required=True, help="output JSON path")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=512)
    args = p.parse_args(argv)

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

    def timed(ps: list, sps: list) -> tuple[float, list[list[int]]]:
        llm.reset_prefix_cache()
        start = time.perf_counter()
        outs = llm.generate(ps, sps, use_tqdm=False)
        elapsed = time.perf_counter() - start
        return elapsed, [list(o.outputs[0].token_ids) for o in outs]

    timed(prompts, params)  # warm-up
    run_s, token_ids = [], []
    for _ in range(args.runs):
        elapsed, token_ids = timed(prompts, params)
        run_s.append(elapsed)

    single_run_s: list[float] = []
    single_ids: list[int] = []
    if workload.get("single"):
        s = workload["single"]
        sp = [{"prompt_token_ids": s["prompt_token_ids"]}]
        ssp = [SamplingParams(temperature=0.0, max_tokens=s["max_tokens"], ignore_eos=True)]
        timed(sp, ssp)
        for _ in range(args.runs):
            elapsed, ids = timed(sp, ssp)
            single_run_s.append(elapsed)
            single_ids = ids[0]

    import vllm

    result = {
        "load_s": load_s, "run_s": run_s, "single_run_s": single_run_s,
        "token_ids": token_ids, "single_token_ids": single_ids,
        "vllm_version": vllm.__version__,
        "env": {k: os.environ.get(k, "") for k in
                ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD")},
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
