"""`workbench bench pd-capacity`: one instance's prefill and decode throughput, measured on the
engine offline, and the P:D split of W instances they imply (`planning.pd_ratio`).

    workbench bench pd-capacity --model DIR --input-len N --output-len N --batch B
                                --num-workers W [--prefill-batch B] [--decode-prompt-len 8]
                                [--repeats 3] [--rate R] [--seed 0] [--json PATH]
                                [--max-other-cpu-share 0.25] [every engine knob]

Flow: build `workbench.LLM` from the folder (fp32, prefix caching off: repeats send the same
lengths) -> one warm-up of each phase -> `--repeats` timed calls of each phase, alternating:

    prefill   `--prefill-batch` prompts of `--input-len` random ordinary tokens, max_tokens=1:
              prompt tokens / the summed duration of the call's engine steps (every step of a
              max_tokens=1 call is a prefill step; the step that finishes a prompt samples its
              one output token, as a prefill instance does)
    decode    `--batch` prompts of `--decode-prompt-len` tokens, `--output-len` tokens each:
              the decode tokens of the call's decode-only steps (no prefill token scheduled)
              / their summed duration, so the prefill steps are left out

Each figure is the median over the repeats (min and max shown); the step trace
(`LLM.step_trace()`) gives the per-step durations. The medians feed `planning.pd_ratio` (W
workers, the same lengths, `--rate`), whose table is printed below. Token ids are random
(seed), greedy and ignore_eos, so every request runs to its length. Other processes taking
more than `--max-other-cpu-share` of the CPUs during the timed calls mark the figures INVALID
(a console line, `valid: false` in the JSON; exit 2 with --strict). The config, the figures
and the step-trace readers are `workbench.harness.pd_capacity`'s.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench import planning as calc
from workbench.engine.arg_utils import add_engine_args, engine_kwargs
from workbench.harness.pd_capacity import (
    PDCapacity,
    PDCapacityConfig,
    PhaseFigure,
    decode_tok_s,
    prefill_tok_s,
)
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    CpuWatch,
    default_cpu_watch,
    disturbed_line,
)

ENGINE_FIXED = ("seed",)  # greedy; --seed is the prompts'


def _prompts(rng: random.Random, n: int, length: int, token_range: tuple[int, int]
             ) -> list[dict[str, list[int]]]:
    low, high = token_range
    return [{"prompt_token_ids": [rng.randrange(low, high) for _ in range(length)]}
            for _ in range(n)]


def model_folder(name: str) -> str:
    """A model folder with config.json, or a shipped name (`NAMED_MODELS`)."""
    from workbench.config.named_models import NAMED_MODELS, resolve_model

    model = resolve_model(name)
    if not (Path(model) / "config.json").is_file():
        raise ValueError(f"model ({name!r}) must be a model folder with config.json "
                         f"(or a shipped name: {', '.join(NAMED_MODELS)})")
    return str(model)


def measure(config: PDCapacityConfig, watch: CpuWatch | None = None) -> PDCapacity:
    """Load the engine, warm up, time both phases `repeats` times, and run `planning.pd_ratio`."""
    from workbench import LLM, SamplingParams
    from workbench.harness.offline_workload import non_special_token_range

    model = model_folder(config.model)
    token_range = non_special_token_range(model)
    rng = random.Random(config.seed)
    llm = LLM(model=model, **config.engine_kwargs())
    prefill_params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    decode_params = SamplingParams(temperature=0.0, max_tokens=config.output_len,
                                   ignore_eos=True)

    def call(phase: str) -> list[dict[str, Any]]:
        if phase == "prefill":
            prompts = _prompts(rng, config.prefill_prompts, config.input_len, token_range)
            params = prefill_params
        else:
            prompts = _prompts(rng, config.batch, config.decode_prompt_len, token_range)
            params = decode_params
        before = len(llm.step_trace())
        outs = llm.generate(prompts, params)
        failed = [o for o in outs if o.outputs[0].error is not None]
        if failed:
            raise RuntimeError(f"{len(failed)} {phase} requests failed in the engine: "
                               f"{failed[0].outputs[0].error}")
        return llm.step_trace()[before:]

    runs: dict[str, list[tuple[int, float, int]]] = {"prefill": [], "decode": []}
    read = {"prefill": prefill_tok_s, "decode": decode_tok_s}
    try:
        call("prefill")  # warm-up: first-call allocations, kernels built or loaded
        call("decode")
        with (watch or default_cpu_watch()).measure() as share:
            for _ in range(config.repeats):
                for phase in ("prefill", "decode"):
                    runs[phase].append(read[phase](call(phase)))
    finally:
        llm.close()
    figures = {}
    for phase, rows in runs.items():
        if any(seconds <= 0 or tokens == 0 for tokens, seconds, _ in rows):
            raise RuntimeError(f"the {phase} calls left no {phase} steps in the step trace")
        figures[phase] = PhaseFigure(
            phase=phase, batch=config.prefill_prompts if phase == "prefill" else config.batch,
            tok_s=tuple(t / s for t, s, _ in rows), tokens=tuple(t for t, _, _ in rows),
            seconds=tuple(s for _, s, _ in rows), steps=tuple(n for _, _, n in rows))
    ratio = calc.pd_ratio(config.num_workers, config.input_len, config.output_len,
                          figures["prefill"].median_tok_s,
                          {config.batch: figures["decode"].median_tok_s},
                          request_rate=config.request_rate)
    others = share.others
    valid = math.isnan(others) or others <= config.max_other_cpu_share
    return PDCapacity(config, figures["prefill"], figures["decode"], ratio, others, valid)


def add_output_args(ap: argparse.ArgumentParser) -> None:
    """--max-other-cpu-share, --strict and --json (the disaggregation benches' outputs)."""
    ap.add_argument("--max-other-cpu-share", type=float, default=DEFAULT_MAX_OTHER_CPU_SHARE,
                    help="the figures are invalid when other processes used more than this "
                    "share of the CPUs meanwhile")
    ap.add_argument("--strict", action="store_true", help="exit 2 when the run was disturbed")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="workbench bench pd-capacity",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model folder (or bundled, demo)")
    ap.add_argument("--input-len", type=int, required=True, help="prompt tokens (prefill)")
    ap.add_argument("--output-len", type=int, required=True,
                    help="output tokens per request (>= 2; the decode phase makes all but one)")
    ap.add_argument("--batch", type=int, required=True, help="decode batch (requests at once)")
    ap.add_argument("--num-workers", type=int, required=True, help="instances to split (>= 2)")
    ap.add_argument("--prefill-batch", type=int, default=None,
                    help="prompts per prefill call (default: --batch)")
    ap.add_argument("--decode-prompt-len", type=int, default=8,
                    help="prompt tokens of the decode phase's requests (short)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per phase (median)")
    ap.add_argument("--rate", type=float, default=None, help="request rate to meet (req/s)")
    ap.add_argument("--seed", type=int, default=0, help="prompt token ids' seed")
    add_output_args(ap)
    add_engine_args(ap, exclude=ENGINE_FIXED, title="engine knobs (default here: fp32, "
                    "prefix caching off, max_num_seqs = the batch)")
    return ap


def main(argv: Sequence[str] | None = None, watch: CpuWatch | None = None) -> int:
    args = _parser().parse_args(argv)
    config = PDCapacityConfig(
        model=args.model, input_len=args.input_len, output_len=args.output_len,
        batch=args.batch, num_workers=args.num_workers, prefill_batch=args.prefill_batch,
        decode_prompt_len=args.decode_prompt_len, repeats=args.repeats, seed=args.seed,
        request_rate=args.rate, max_other_cpu_share=args.max_other_cpu_share,
        engine=engine_kwargs(args, ENGINE_FIXED))
    result = measure(config, watch)
    others = ("n/a" if math.isnan(result.other_cpu_share)
              else f"{result.other_cpu_share:.0%}")
    print(f"model {config.model}; medians of {config.repeats} calls per phase after a "
          f"warm-up; others' CPU {others}\n")
    print(result.table())
    print(f"\ncalc.pd_ratio for {config.num_workers} workers, input {config.input_len}, "
          f"output {config.output_len} tokens:\n")
    print(result.ratio.table())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.as_dict(), indent=1))
    if not result.valid:
        print(disturbed_line("bench pd-capacity", result.other_cpu_share,
                             config.max_other_cpu_share))
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
