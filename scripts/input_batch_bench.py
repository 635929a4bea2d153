"""Per-step input preparation before/after the persistent input batch (docs/step_account.md).

    .venv/bin/python scripts/input_batch_bench.py [--runs 3] [--threads 1] [--prompt-len 32 448]
                                                    [--micro 96 512 2048]

The demo-sized model of `scripts/step_account_bench.py`, 48 greedy requests (prompt
`--prompt-len` random tokens, 64 output tokens, ignore_eos; the prefix cache reset before
each run, so every run prefills), one engine per prompt length.
Two variants alternate run by run on the same engine: "rebuild" patches the runner's old
per-step rebuild back in (the test oracle `rebuild_inputs` of tests/worker/test_input_batch.py:
Python lists of each request's tokens and whole block lists every step), "persistent" is the
runner's `InputBatch`. Each run reports the overhead account of its own steps
(`overhead_account`), with the other processes' CPU share (`default_cpu_watch`); the summary
is the median per variant. Token ids must be identical between the variants.
`--micro` first times `prepare_inputs` alone, without a model (`micro`: 48 decoding requests
of each given context, block size 16, the median of 270 steps per variant).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from step_account_bench import model_folder  # noqa: E402

from tests.worker.test_input_batch import Messenger, Worker, rebuild_inputs  # noqa: E402
from workbench import LLM, SamplingParams  # noqa: E402
from workbench.core.request import Request  # noqa: E402
from workbench.harness.validity import default_cpu_watch  # noqa: E402
from workbench.metrics.step_account import overhead_account  # noqa: E402
from workbench.worker.input_batch import InputBatch  # noqa: E402
from workbench.worker.model_runner import ModelRunner  # noqa: E402
from workbench.worker.request_state import CachedRequestState  # noqa: E402


def rebuild_prepare(self: ModelRunner, out: Any, reqs: list[CachedRequestState]) -> Any:
    """The old per-step rebuild, read from the runner's request states."""
    truth: Any = [(SimpleNamespace(request_id=st.req_id, all_token_ids=st.all_token_ids,
                                   num_computed_tokens=st.num_computed_tokens), st.block_ids)
                  for st in reqs]
    *inputs, sampled = rebuild_inputs(out, truth, self.block_size)
    return (*inputs, [self.requests[x.req_id] for x in sampled])


def micro(context: int, variant: str, num_requests: int = 48, steps: int = 300) -> float:
    """Median ms of one decode step's input preparation alone (no model): `num_requests`
    requests of `context` tokens, block size 16, one new token each per step. The
    persistent variant includes bringing the worker's request states to the message."""
    bs = 16
    reqs = [Request(f"r{i}", list(range(10, 10 + context)), SamplingParams(max_tokens=steps))
            for i in range(num_requests)]
    blocks = {r.request_id: list(range(1 + i * 1000, 2 + i * 1000 + (context + steps) // bs))
              for i, r in enumerate(reqs)}
    worker, messenger = Worker(InputBatch(64, context + steps, bs)), Messenger()
    times = []
    for r in reqs:
        r.num_computed_tokens = context - 1
    for _ in range(steps):
        out = messenger.step(*[(r, 1, blocks[r.request_id]) for r in reqs])
        t0 = time.perf_counter()
        if variant == "rebuild":
            rebuild_inputs(out, messenger.truth, bs)
        else:
            worker.prepare(out)
        times.append(time.perf_counter() - t0)
        for r in reqs:
            r.num_computed_tokens += 1
            r.append_output_token_ids([7])
        worker.sampled({r.request_id: [7] for r in reqs})
    return 1e3 * statistics.median(times[steps // 10:])

def one_run(llm: LLM, prompts: list[list[int]], variant: str) -> dict[str, Any]:
    runner = llm.engine.runner
    if variant == "rebuild":
        runner.prepare_inputs = types.MethodType(rebuild_prepare, runner)
    else:
        runner.__dict__.pop("prepare_inputs", None)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    llm.reset_prefix_cache()  # every run prefills its prompts again
    first = len(llm.step_trace())
    with default_cpu_watch().measure() as share:
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [params] * len(prompts))
        wall = time.perf_counter() - t0
    acc = overhead_account(llm.step_trace()[first:])
    return {"output_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / wall,
            "other_cpu_share": share.others, **acc,
            "tokens": [list(o.outputs[0].token_ids) for o in outs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--prompt-len", type=int, nargs="*", default=[32, 448])
    ap.add_argument("--micro", type=int, nargs="*", default=[96, 512, 2048],
                    help="contexts for the model-free timing of input preparation alone")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    summary: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    if args.micro:  # input preparation alone, no model
        with default_cpu_watch().measure() as share:
            summary["micro_ms"] = {c: {v: round(micro(c, v), 4) for v in ("rebuild", "persistent")}
                                   for c in args.micro}
        summary["micro_other_cpu_share"] = share.others
    for plen in args.prompt_len:
        llm = LLM(model_folder(), dtype="float32", max_model_len=512, max_num_seqs=64,
                  max_num_batched_tokens=2048, seed=0)
        rng = random.Random(plen)
        prompts = [[rng.randrange(10, 4096) for _ in range(plen)]
                   for _ in range(args.num_requests)]
        runs: dict[str, list[dict[str, Any]]] = {"rebuild": [], "persistent": []}
        for variant in runs:
            one_run(llm, prompts, variant)  # warm-up
        for i in range(args.runs):  # interleaved, the first variant alternating
            for variant in sorted(runs, reverse=i % 2 == 1):
                kept = runs[variant]
                kept.append(one_run(llm, prompts, variant))
        ref = runs["rebuild"][0]["tokens"]
        assert all(r.pop("tokens") == ref for rs in runs.values() for r in rs), "tokens differ"
        keys = ("output_tok_s", "step_ms", "prepare_inputs_ms", "forward_ms", "overhead_share")
        summary[f"prompt_{plen}"] = {
            variant: {**{k: statistics.median(r[k] for r in rs) for k in keys},
                      "num_steps": rs[0]["num_steps"],
                      "prepare_inputs_ms_runs": [round(r["prepare_inputs_ms"], 4) for r in rs],
                      "other_cpu_share_max": max(r["other_cpu_share"] for r in rs)}
            for variant, rs in runs.items()}
        del llm
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
