"""`workbench bench pd-push`: the disaggregated hand-over, pull vs push, on one machine.

    workbench bench pd-push --model DIR --input-len N [--num-prompts K] [--repeats 3]
                            [--seed 0] [--push-wait-s 1] [--json PATH]
                            [--max-other-cpu-share 0.25]
                            [every engine knob]

A prefill engine (kv_producer, layerwise staging) and a decode engine (kv_consumer) in this
process, the KV over ZeroMQ on 127.0.0.1. After a warm-up of each mode, `--repeats` rounds
alternate the two modes on fresh random prompts (K prompts of N tokens each):

    pull   the prefill leg (max_tokens=1, do_remote_decode), then the decode leg reads the
           staged KV from the producer (the default flow)
    push   the prefill leg names the decode engine's side channel, so each layer's KV is sent
           there while the prefill runs; the decode leg finds it in its inbox

and times the prefill leg (the K prompts) and the decode leg up to its first token (max_tokens
1: the KV hand-over, the last prompt token recomputed, one sample): the part of TTFT that
disaggregation adds after the prefill. Per request it also gives the seconds the decode side
spent getting the KV (`workbench:kv_transfer_recv_time`). Medians over the repeats, push /
pull ratios, and a check that both modes gave the same first tokens. Other processes taking
more than `--max-other-cpu-share` of the CPUs mark the figures INVALID.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.bench.disagg.capacity import _prompts, add_output_args, model_folder
from workbench.engine.arg_utils import add_engine_args, engine_kwargs
from workbench.harness.pd_capacity import positive_int
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    CpuWatch,
    default_cpu_watch,
    disturbed_line,
)

ENGINE_FIXED = ("seed", "kv_transfer_config")
MODES = ("pull", "push")
FIGURES = ("prefill_leg_s", "decode_first_token_s", "kv_recv_ms_per_request")


@dataclass(frozen=True)
class PDPushConfig:
    model: str
    input_len: int
    num_prompts: int = 8
    repeats: int = 3
    seed: int = 0
    max_other_cpu_share: float = DEFAULT_MAX_OTHER_CPU_SHARE
    push_wait_s: float = 1.0  # the consumer's kv_connector_extra_config push_wait_s
    engine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("input_len", "num_prompts", "repeats"):
            positive_int(name, getattr(self, name))
        if isinstance(self.push_wait_s, bool) or not isinstance(self.push_wait_s, int | float) \
                or not self.push_wait_s > 0:
            raise ValueError(f"push_wait_s must be a number > 0, got {self.push_wait_s!r}")
        if self.input_len < 2:
            raise ValueError(f"input_len must be >= 2 (a prompt with KV to hand over), got "
                             f"{self.input_len}")
        if not 0 <= self.max_other_cpu_share <= 1:
            raise ValueError(f"max_other_cpu_share must be in [0, 1], got "
                             f"{self.max_other_cpu_share!r}")

    def engine_kwargs(self) -> dict[str, Any]:
        return {"dtype": "float32", "enable_prefix_caching": False,
                "max_num_seqs": self.num_prompts, "max_model_len": self.input_len + 8,
                **self.engine}


@dataclass
class PDPush:
    config: PDPushConfig
    runs: dict[str, dict[str, list[float]]]  # mode -> figure -> one value per repeat
    pushed_loads: int  # push rounds: loads served from pushed KV (of repeats x prompts)
    first_tokens_equal: bool
    other_cpu_share: float
    valid: bool

    def median(self, mode: str, figure: str) -> float:
        return statistics.median(self.runs[mode][figure])

    def table(self) -> str:
        lines = ["| figure | pull | push | push / pull |", "|---|---:|---:|---:|"]
        for fig in FIGURES:
            a, b = self.median("pull", fig), self.median("push", fig)
            lines.append(f"| {fig} | {a:.4g} | {b:.4g} | {b / a:.2f}x |" if a else
                         f"| {fig} | {a:.4g} | {b:.4g} | – |")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        c = self.config
        return {"model": c.model, "input_len": c.input_len, "num_prompts": c.num_prompts,
                "repeats": c.repeats, "runs": self.runs,
                "medians": {m: {f: self.median(m, f) for f in FIGURES} for m in MODES},
                "pushed_loads": self.pushed_loads,
                "first_tokens_equal": self.first_tokens_equal,
                "other_cpu_share": None if math.isnan(self.other_cpu_share)
                else self.other_cpu_share, "valid": self.valid}


def measure(config: PDPushConfig, watch: CpuWatch | None = None) -> PDPush:
    from workbench import LLM, SamplingParams
    from workbench.harness.offline_workload import non_special_token_range

    model = model_folder(config.model)
    token_range = non_special_token_range(model)
    rng = random.Random(config.seed)
    kw = config.engine_kwargs()
    prod = LLM(model=model, kv_transfer_config={
        "kv_connector": "P2pConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"layerwise": True}}, **kw)
    cons = LLM(model=model, kv_transfer_config={
        "kv_connector": "P2pConnector", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"push_wait_s": config.push_wait_s}}, **kw)
    info = cons.engine.kv_transfer_info() or {}
    legs = {"pull": {"do_remote_decode": True},
            "push": {"do_remote_decode": True, "remote_host": info.get("side_channel_host"),
                     "remote_port": info.get("side_channel_port")}}

    def counter(llm: Any, name: str) -> float:
        return float(llm.engine.stats.counters[name])

    def round_(mode: str) -> tuple[dict[str, float], list[int], int]:
        prompts = _prompts(rng, config.num_prompts, config.input_len, token_range)
        leg = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True,
                             extra_args={"kv_transfer_params": legs[mode]})
        t0 = time.perf_counter()
        handshakes = [o.kv_transfer_params for o in prod.generate(prompts, leg)]
        prefill_s = time.perf_counter() - t0
        recv0 = counter(cons, "workbench:kv_transfer_recv_time")
        pushed0 = counter(cons, "workbench:kv_transfer_pushed_loads")
        t0 = time.perf_counter()
        outs = cons.generate(prompts, [SamplingParams(
            temperature=0.0, max_tokens=1, ignore_eos=True,
            extra_args={"kv_transfer_params": k}) for k in handshakes])
        first_s = time.perf_counter() - t0
        failed = [o for o in outs if o.outputs[0].error is not None]
        if failed or any(k is None for k in handshakes):
            raise RuntimeError(f"a {mode} round lost requests: "
                               f"{failed[0].outputs[0].error if failed else 'no handshake'}")
        recv = counter(cons, "workbench:kv_transfer_recv_time") - recv0
        pushed = int(counter(cons, "workbench:kv_transfer_pushed_loads") - pushed0)
        figures = {"prefill_leg_s": prefill_s, "decode_first_token_s": first_s,
                   "kv_recv_ms_per_request": 1000 * recv / config.num_prompts}
        return figures, [o.outputs[0].token_ids[0] for o in outs], pushed

    runs: dict[str, dict[str, list[float]]] = {m: {f: [] for f in FIGURES} for m in MODES}
    pushed_loads, equal = 0, True
    try:
        for mode in MODES:
            round_(mode)  # warm-up
        with (watch or default_cpu_watch()).measure() as share:
            for _ in range(config.repeats):
                state = rng.getstate()
                firsts = {}
                for mode in MODES:  # the same prompts in both modes of a round
                    rng.setstate(state)
                    figures, firsts[mode], pushed = round_(mode)
                    for name, value in figures.items():
                        runs[mode][name].append(value)
                    pushed_loads += pushed if mode == "push" else 0
                equal = equal and firsts["pull"] == firsts["push"]
    finally:
        prod.close()
        cons.close()
    others = share.others
    valid = math.isnan(others) or others <= config.max_other_cpu_share
    return PDPush(config, runs, pushed_loads, equal, others, valid)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="workbench bench pd-push",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model folder (or bundled, demo)")
    ap.add_argument("--input-len", type=int, required=True, help="prompt tokens")
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts per round")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per mode (median)")
    ap.add_argument("--seed", type=int, default=0, help="prompt token ids' seed")
    ap.add_argument("--push-wait-s", type=float, default=1.0,
                    help="how long a decode read waits for KV pushed to it that is still on "
                    "the wire before it pulls (the consumer's push_wait_s)")
    add_output_args(ap)
    add_engine_args(ap, exclude=ENGINE_FIXED, title="engine knobs of both engines (default "
                    "here: fp32, prefix caching off, max_num_seqs = --num-prompts)")
    return ap


def main(argv: Sequence[str] | None = None, watch: CpuWatch | None = None) -> int:
    args = _parser().parse_args(argv)
    config = PDPushConfig(model=args.model, input_len=args.input_len,
                          num_prompts=args.num_prompts, repeats=args.repeats, seed=args.seed,
                          max_other_cpu_share=args.max_other_cpu_share,
                          push_wait_s=args.push_wait_s,
                          engine=engine_kwargs(args, ENGINE_FIXED))
    result = measure(config, watch)
    others = ("n/a" if math.isnan(result.other_cpu_share)
              else f"{result.other_cpu_share:.0%}")
    print(f"model {config.model}; {config.num_prompts} prompts of {config.input_len} tokens; "
          f"medians of {config.repeats} rounds per mode after a warm-up; others' CPU {others}\n")
    print(result.table())
    total = config.repeats * config.num_prompts
    print(f"\npush rounds: {result.pushed_loads} of {total} loads served from pushed KV; "
          f"first tokens {'equal' if result.first_tokens_equal else 'DIFFERENT'} in both modes")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.as_dict(), indent=1))
    if not result.first_tokens_equal:
        return 1
    if not result.valid:
        print(disturbed_line("bench pd-push", result.other_cpu_share,
                             config.max_other_cpu_share))
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
