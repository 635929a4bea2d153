"""`workbench calc pd`'s predicted best prefill:decode split against the simulated goodput
curve over every split of a fixed GPU count (issue 33).

    python scripts/sim_pd_vs_calc.py [--model Llama-3-8B] [--hardware H100-SXM] [--gpus 4]
        [--link 400gbe] [--input-len 1024] [--output-len 128] [--rates 10,20,...,120]
        [--num-requests 400] [--ttft-ms 400] [--tpot-ms 25] [--attainment 0.9]

calc's side (`planning.pd.pd_ratio`, first order): a prefill instance's prompt tokens/s and
a decode instance's output tokens/s at each batch are read off the same analytic cost model
the simulator steps with (a full token budget of prompts of --input-len; decode batches of
1 .. max_num_seqs at the mean context input + output / 2, capped by the KV pool), plus the
KV bytes per token (core's arithmetic) over the link. The simulator's side: every P:D split
of --gpus instances (and the colocated layout) runs the same seeded Poisson workload (fixed
lengths, distinct prompts) at each rate; goodput is the highest rate at which --attainment
of the requests meet TTFT <= --ttft-ms and TPOT <= --tpot-ms (`harness.goodput`). Printed:
one row per split, calc's capacity and bottleneck beside the simulated goodput; then both
answers. No wall clock in the figures (step_noise 0): any machine prints the same table.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.goodput import GoodputSLO, goodput, slo_attainment
from workbench.harness.workloads import BenchRequest, Workload
from workbench.planning.pd import pd_ratio
from workbench.planning.transfer import link_bandwidth
from workbench.sim.batch import BatchComposition
from workbench.sim.deploy import kv_bytes_per_token
from workbench.sim.target import build_cost_model, num_gpu_blocks, run_simulated


def calc_inputs(target: dict[str, Any], config: dict[str, Any], input_len: int,
                output_len: int) -> dict[str, Any]:
    """prefill_tok_s, the decode curve {batch: tok/s} and KV bytes/token from the cost model."""
    cost = build_cost_model(target, config)
    budget, max_seqs = int(config["max_num_batched_tokens"]), int(config["max_num_seqs"])
    k = max(1, budget // input_len)  # prompts per prefill step
    t = cost.step_time_s(BatchComposition(
        prefill_tokens=k * input_len, prefill_attn_pairs=k * input_len * (input_len + 1) // 2,
        num_seqs=k, sampled_rows=k))
    blocks = num_gpu_blocks(target, config, cost, int(config["block_size"]))
    fits = blocks * int(config["block_size"]) // (input_len + output_len)
    ctx = input_len + output_len // 2
    curve: dict[int, float] = {}
    b = 1
    while b <= min(max_seqs, fits):
        curve[b] = b / cost.step_time_s(BatchComposition(
            decode_tokens=b, decode_context_tokens=b * ctx, num_seqs=b, sampled_rows=b))
        b *= 2
    return {"prefill_tok_s": k * input_len / t, "decode_tok_s": curve,
            "kv_bytes_per_token": kv_bytes_per_token(cost)}


def workload(n: int, input_len: int, output_len: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return Workload("pd-fixed", seed, {"input_len": input_len, "output_len": output_len},
                    tuple(BenchRequest(f"r{i}", [rng.randrange(1, 120_000)
                                                 for _ in range(input_len)], output_len)
                          for i in range(n)))


def sim_goodput(target: dict[str, Any], config: dict[str, Any], wl: Workload,
                rates: list[float], slo: GoodputSLO, gpus: int) -> tuple[float, bool, list[float]]:
    curve = []
    for rate in rates:
        run = run_simulated(target, config, wl, ArrivalSpec(mode="poisson", rate=rate, seed=0))
        curve.append((rate, slo_attainment(run.records, slo)))
    g = goodput(curve, slo.attainment, gpus)
    return g.rate, g.lower_bound, [a for _, a in curve]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="Llama-3-8B")
    p.add_argument("--hardware", default="H100-SXM")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--link", default="400gbe")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rates", default="10,20,30,40,50,60,70,80,90,100,120")
    p.add_argument("--num-requests", type=int, default=400)
    p.add_argument("--ttft-ms", type=float, default=400.0)
    p.add_argument("--tpot-ms", type=float, default=25.0)
    p.add_argument("--attainment", type=float, default=0.9)
    a = p.parse_args(argv)
    rates = [float(r) for r in a.rates.split(",")]
    target: dict[str, Any] = {"kind": "simulated", "model": a.model, "hardware": a.hardware,
                              "step_noise": 0, "kv_transfer": {"link": a.link}}
    config: dict[str, Any] = {"max_model_len": 4096, "block_size": 16, "max_num_seqs": 128,
                              "max_num_batched_tokens": 2048, "enable_prefix_caching": True}
    inputs = calc_inputs(target, config, a.input_len, a.output_len)
    calc = pd_ratio(a.gpus, a.input_len, a.output_len, inputs["prefill_tok_s"],
                    inputs["decode_tok_s"], kv_bytes_per_token=inputs["kv_bytes_per_token"],
                    link_bandwidth_bytes_per_s=link_bandwidth(a.link))
    slo = GoodputSLO(a.ttft_ms, a.tpot_ms, a.attainment)
    wl = workload(a.num_requests, a.input_len, a.output_len)
    print(f"{a.model} on {a.gpus} x {a.hardware} (analytic, uncalibrated), KV over {a.link}; "
          f"prompts {a.input_len}, outputs {a.output_len}; SLO TTFT <= {a.ttft_ms:g} ms, TPOT "
          f"<= {a.tpot_ms:g} ms for {a.attainment:.0%}; rates {a.rates} req/s\n")
    print(f"calc inputs: prefill {inputs['prefill_tok_s']:.0f} tok/s per instance, decode "
          f"{calc.decode_tok_s:.0f} tok/s at batch {calc.decode_batch}, KV "
          f"{inputs['kv_bytes_per_token']} B/token\n")
    print("| P:D | calc system req/s | calc bottleneck | sim goodput req/s | sim per GPU | "
          "attainment per rate |")
    print("|---|---:|---|---:|---:|---|")
    sims: dict[str, float] = {}
    layouts: list[tuple[str, dict[str, Any]]] = [
        (s.label, {"num_workers": a.gpus, "num_prefill": s.prefill_instances})
        for s in calc.splits]
    layouts.append(("colocated", {"num_workers": a.gpus}))
    for label, knobs in layouts:
        rate, lower, atts = sim_goodput(target, {**config, **knobs}, wl, rates, slo, a.gpus)
        sims[label] = rate
        split = next((s for s in calc.splits if s.label == label), None)
        calc_cells = (f"{split.system_rate:.2f}{' *' if split == calc.best else ''} | "
                      f"{split.bottleneck}") if split else f"{calc.colocated_rate:.2f} | -"
        print(f"| {label} | {calc_cells} | {'>= ' if lower else ''}{rate:.2f} | "
              f"{rate / a.gpus:.2f} | {' '.join(f'{x:.2f}' for x in atts)} |")
    best_sim = max((k for k in sims if k != "colocated"), key=lambda k: sims[k])
    print(f"\ncalc pd's best split: {calc.best.label} ({calc.best.system_rate:.2f} req/s, "
          f"first order, no SLO); simulated best: {best_sim} ({sims[best_sim]:.2f} req/s "
          f"goodput); colocated: {sims['colocated']:.2f} req/s")


if __name__ == "__main__":
    main()
