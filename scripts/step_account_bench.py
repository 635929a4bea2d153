"""Measure the step's overhead account on the demo-sized model (docs/step_account.md).

    .venv/bin/python scripts/step_account_bench.py [--runs 5] [--mode greedy|sampled|both]
                                                   [--threads N]

A random-init Llama of the demo's size (hidden 256, 4 layers, vocab 4096; written once into
.bench/step-account-model), 48 requests of 32 prompt tokens and 64 output tokens each
(ignore_eos), one engine, one warm-up generate, then `--runs` measured generates per mode
("greedy": temperature 0; "sampled": temperature 0.8, top_p 0.95, a seed per request).
Each run reports engine output tok/s, steps/s and `overhead_account` of its own steps, with
the other processes' CPU share (`default_cpu_watch`); the summary is the median per column.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from workbench import LLM, SamplingParams
from workbench.harness.validity import default_cpu_watch
from workbench.metrics.step_account import overhead_account
from workbench.testing import tiny_checkpoint

MODEL_DIR = Path(".bench/step-account-model")
DEMO_SIZE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=32, vocab_size=4096)


def model_folder() -> Path:
    if not (MODEL_DIR / "config.json").is_file():
        tiny_checkpoint(MODEL_DIR, arch="llama", seed=0, **DEMO_SIZE)
    return MODEL_DIR


def params(mode: str, n: int, max_tokens: int) -> list[SamplingParams]:
    if mode == "greedy":
        return [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)] * n
    return [SamplingParams(temperature=0.8, top_p=0.95, seed=i, max_tokens=max_tokens,
                           ignore_eos=True) for i in range(n)]


def one_run(llm: LLM, prompts: list[list[int]], mode: str, max_tokens: int) -> dict[str, Any]:
    first = len(llm.step_trace())
    watch = default_cpu_watch()
    with watch.measure() as share:
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            params(mode, len(prompts), max_tokens))
        wall = time.perf_counter() - t0
    rows = llm.step_trace()[first:]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"wall_s": wall, "output_tok_s": tokens / wall, "steps_s": len(rows) / wall,
            "other_cpu_share": share.others, **overhead_account(rows),
            "tokens": [o.outputs[0].token_ids for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mode", choices=("greedy", "sampled", "both"), default="both")
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--tokens-out", default="", help="write each mode's token ids (JSON)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(model_folder(), dtype="float32", max_model_len=512, max_num_seqs=64,
              max_num_batched_tokens=2048, seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 4096) for _ in range(32)] for _ in range(args.num_requests)]
    modes = ("greedy", "sampled") if args.mode == "both" else (args.mode,)
    summary: dict[str, Any] = {}
    tokens: dict[str, Any] = {}
    for mode in modes:
        one_run(llm, prompts, mode, args.max_tokens)  # warm-up
        runs = [one_run(llm, prompts, mode, args.max_tokens) for _ in range(args.runs)]
        tokens[mode] = runs[0].pop("tokens")
        for r in runs[1:]:
            assert r.pop("tokens") == tokens[mode], "runs of one mode gave other tokens"
        keys = [k for k in runs[0] if isinstance(runs[0][k], int | float)]
        summary[mode] = {k: statistics.median(r[k] for r in runs) for k in keys}
        summary[mode]["other_cpu_share_max"] = max(r["other_cpu_share"] for r in runs)
        summary[mode]["runs"] = [{k: r[k] for k in ("output_tok_s", "steps_s",
                                                     "other_cpu_share")} for r in runs]
    summary["torch_threads"] = torch.get_num_threads()
    print(json.dumps(summary, indent=1))
    if args.tokens_out:
        Path(args.tokens_out).write_text(json.dumps(tokens))


if __name__ == "__main__":
    main()
