"""`workbench bench spec`: speculative decoding on vs off, measured and predicted (seed 002).

Part 1, n-gram: on the `repetitive` workload (greedy, ignore_eos, each request asks for as
many tokens as its repeated text), for each concurrency C (engine max_num_seqs = C, all
requests submitted at once, offline), run the engine without speculation and with
`{"method": "ngram", "num_speculative_tokens": k}`; per point: median wall time of `--runs`
timed runs after a warm-up (prefix cache reset before each), output tok/s, the spec-decode
counters of the last run, acceptance rate, mean acceptance length (1 + accepted / drafts),
the predicted speed-up from forward-pass counts (`planning.spec_predicted_speedup`: output /
(output - accepted)) beside the measured one, and whether the output token ids are identical
to the non-speculative run.

Part 2, draft model: the demo pair (target + draft sharing one tokenizer), concurrency 1,
k in `--draft-ks`, on held-out stdlib code (`code_requests`: the pair was trained on Python
source; its 2-layer draft cannot copy random words, so on the repetitive workload it only
predicts the first draft position): speed-up vs k and acceptance by position
(per-position counter / drafts), n-gram k beside it on the same prompts.

Every timed run is measured with `validity.CpuWatch`: a point during which other processes
used more than `--max-other-cpu-share` of the CPUs is INVALID (a console line, the table's
"others' CPU" column) and no speed-up is computed from it.

Prints Markdown tables (`harness.spec_points`: the point, its counters and tables); `--json
PATH` writes every point. Notebook 07 asks the same question through the experiment runner
(`workbench.experiments.studies.speculation`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from workbench.harness.spec_points import SpecPoint, position_table, spec_counters, table
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    CpuWatch,
    Validity,
    default_cpu_watch,
    disturbed_line,
)


def run_point(
    model: str | Path,
    prompts: list[list[int]],
    max_tokens: list[int],
    concurrency: int,
    spec: dict[str, Any] | None,
    runs: int,
    label: str,
    engine_kwargs: dict[str, Any] | None = None,
    watch: CpuWatch | None = None,
    max_other_cpu_share: float | None = DEFAULT_MAX_OTHER_CPU_SHARE,
) -> SpecPoint:
    """One engine configuration: a warm-up, then `runs` timed runs of the whole prompt list,
    each inside `watch` (default `validity.default_cpu_watch()`); invalid when other
    processes used more than `max_other_cpu_share` of the CPUs in any of them."""
    watch = watch if watch is not None else default_cpu_watch()
    from workbench import LLM, SamplingParams

    llm = LLM(model, max_num_seqs=concurrency, speculative_config=spec, **(engine_kwargs or {}))
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    warm = min(len(prompts), concurrency)
    llm.generate(prompts[:warm], params[:warm])
    times: list[float] = []
    token_ids: list[list[int]] = []
    before = after = spec_counters(llm.stats())
    shares: list[float] = []
    for _ in range(runs):
        llm.reset_prefix_cache()
        before = spec_counters(llm.stats())
        with watch.measure() as share:
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params)
            times.append(time.perf_counter() - t0)
        shares.append(share.others)
        after = spec_counters(llm.stats())
        token_ids = [o.outputs[0].token_ids for o in outs]
    per_pos = [a - (before[3][i] if i < len(before[3]) else 0) for i, a in enumerate(after[3])]
    measured = [x for x in shares if not math.isnan(x)]
    validity = Validity()
    validity.judge_cpu(max(measured) if measured else float("nan"), max_other_cpu_share)
    if validity.disturbed:
        print(disturbed_line(f"point {label} (concurrency {concurrency})",
                             max(measured), max_other_cpu_share or 0.0), flush=True)
    return SpecPoint(
        label=label, concurrency=concurrency, run_s=times,
        output_tokens=sum(len(t) for t in token_ids),
        num_drafts=after[0] - before[0], num_draft_tokens=after[1] - before[1],
        num_accepted=after[2] - before[2], accepted_per_pos=per_pos, token_ids=token_ids,
        others_cpu=max(measured) if measured else float("nan"), valid=validity.valid,
    )


def repetitive_requests(model: str | Path, num_requests: int, seed: int
                        ) -> tuple[list[list[int]], list[int]]:
    from workbench.config.named_models import resolve_model
    from workbench.harness.workloads import make_workload
    from workbench.models.tokenizer import load_tokenizer

    tok = load_tokenizer(resolve_model(model))
    wl = make_workload("repetitive", seed, tok, num_requests=num_requests)
    return [list(r.prompt_token_ids) for r in wl.requests], [r.max_tokens for r in wl.requests]


def code_requests(model: str | Path, num_requests: int, seed: int, prompt_len: int = 96,
                  max_tokens: int = 64) -> tuple[list[list[int]], list[int]]:
    """Held-out Python stdlib source (what the demo pair was trained on, but files it never
    saw): `num_requests` windows of `prompt_len` tokens at seeded offsets."""
    import random

    from workbench.config.named_models import resolve_model
    from workbench.testing.demo_pair import held_out_stream

    ids = held_out_stream(Path(resolve_model(model))).tolist()
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(0, len(ids) - prompt_len, prompt_len), num_requests))
    return [ids[s : s + prompt_len] for s in starts], [max_tokens] * num_requests


def compare(
    model: str | Path, prompts: list[list[int]], max_tokens: list[int], concurrency: int,
    specs: list[tuple[str, dict[str, Any]]], runs: int, watch: CpuWatch | None = None,
    max_other_cpu_share: float | None = DEFAULT_MAX_OTHER_CPU_SHARE,
) -> list[SpecPoint]:
    """"off" plus each (label, speculative_config) at one concurrency; identical checked."""
    kw: dict[str, Any] = {"watch": watch, "max_other_cpu_share": max_other_cpu_share}
    off = run_point(model, prompts, max_tokens, concurrency, None, runs, "off", **kw)
    points = [off]
    for label, spec in specs:
        p = run_point(model, prompts, max_tokens, concurrency, spec, runs, label, **kw)
        p.identical = p.token_ids == off.token_ids
        points.append(p)
    return points


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="workbench bench spec", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo", help="target model folder or a shipped name")
    ap.add_argument("--draft", default="demo-draft", help="draft model folder or name")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=5)
    ap.add_argument("--prompt-lookup-min", type=int, default=2)
    ap.add_argument("--prompt-lookup-max", type=int, default=5)
    ap.add_argument("--draft-ks", type=int, nargs="*", default=[1, 2, 3, 5])
    ap.add_argument("--num-requests", type=int, default=None,
                    help="default: max(8, 2 x concurrency) per concurrency")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--max-other-cpu-share", type=float, default=DEFAULT_MAX_OTHER_CPU_SHARE,
                    help="a point is invalid when other processes used more than this share "
                    "of the CPUs during one of its timed runs (0..1)")
    args = ap.parse_args(argv)
    if not 0 <= args.max_other_cpu_share <= 1:
        ap.error(f"--max-other-cpu-share ({args.max_other_cpu_share}) must be in [0, 1]")
    judged: dict[str, Any] = {"max_other_cpu_share": args.max_other_cpu_share}

    k = args.num_speculative_tokens
    ngram = {"method": "ngram", "num_speculative_tokens": k,
             "prompt_lookup_min": args.prompt_lookup_min,
             "prompt_lookup_max": args.prompt_lookup_max}
    all_points: list[SpecPoint] = []
    print(f"## n-gram k={k} vs off, repetitive workload, {Path(args.model).name}, "
          f"medians of {args.runs}\n", flush=True)
    for c in args.concurrency:
        n = args.num_requests or max(8, 2 * c)
        prompts, max_tokens = repetitive_requests(args.model, n, args.seed)
        all_points += compare(args.model, prompts, max_tokens, c, [(f"ngram k={k}", ngram)],
                              args.runs, **judged)
        print(table([p for p in all_points if p.concurrency == c]), flush=True)
    ng = [p for p in all_points if p.label.startswith("ngram")]
    print("\nn-gram acceptance by position:\n" + position_table(ng))
    draft_points: list[SpecPoint] = []
    if args.draft_ks:
        n = args.num_requests or 8
        prompts, max_tokens = code_requests(args.model, n, args.seed)
        specs = [(f"draft k={dk}", {"method": "draft_model", "model": args.draft,
                                    "num_speculative_tokens": dk}) for dk in args.draft_ks]
        specs.append((f"ngram k={k}", ngram))
        draft_points = compare(args.model, prompts, max_tokens, 1, specs, args.runs, **judged)
        print(f"\n## draft model {args.draft} -> {args.model}, held-out stdlib code "
              "(96-token prompts, 64 tokens out), concurrency 1\n")
        print(table(draft_points))
        print("\ndraft-model acceptance by position:\n" + position_table(draft_points[1:]))
    if args.json:
        args.json.write_text(json.dumps(
            {"ngram": [p.to_dict() for p in all_points],
             "draft_model": [p.to_dict() for p in draft_points]}, indent=2))


if __name__ == "__main__":
    main()
