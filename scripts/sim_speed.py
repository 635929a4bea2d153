"""How fast the simulator runs on this machine: simulated requests per second of wall time for
a few sizes, and the largest run (issue 33: one hour of a 100 req/s trace over 64 instances,
360,000 requests) measured or, with --largest-scale, measured at a fraction of the hour and
extrapolated (labelled as such).

    python scripts/sim_speed.py                          # SIZES, then the largest at 1/120
    python scripts/sim_speed.py --largest-scale 1.0      # the full hour (memory: see below)
    python scripts/sim_speed.py --one 64 100 30          # one run: instances, rate, seconds

Every run is a child process of its own, so its peak memory (`resource.getrusage`
ru_maxrss, the child's) is that run's alone; each is watched for the CPU share other
processes took meanwhile (`harness.watched`), printed beside the figure, since other work
on a shared machine slows a run down, with the share of one core the run itself got (its
CPU seconds per wall second: the simulator is one thread).

The traffic: Poisson arrivals at `rate` for `seconds`; prompts lognormal p50 256 / p95 1024
tokens (max 4096), outputs lognormal p50 128 / p95 512 (seeded; token ids drawn from a
shared pool of int objects, so the workload holds 8 bytes per prompt token); Llama-3-8B on the
analytic H100-SXM profile, engine defaults (prefix caching on, budget 8192, max_num_seqs
256), least-outstanding routing, the analytic profile's step noise (0.02). The clock starts
after the workload is built: the figure is `simulate()` alone (the step trace and every
request's timeline kept, as a template run keeps them).

The largest run's extrapolation: wall time and peak memory grow with simulated time at a
fixed rate and instance count (steps and requests both do), so two scaled runs (the scale and
twice it) give a line a + b x seconds, read at 3,600 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

SIZES: tuple[tuple[int, float, float], ...] = ((1, 4.0, 120.0), (4, 16.0, 60.0),
                                               (16, 50.0, 30.0), (64, 100.0, 15.0))
LARGEST = (64, 100.0, 3600.0)
TARGET = {"kind": "simulated", "model": "Llama-3-8B", "hardware": "H100-SXM",
          "router_policy": "least_outstanding"}
ENGINE = {"max_model_len": 8192}


def workload(num_requests: int, seed: int = 0) -> Any:
    from workbench.harness.lengths import LengthDist
    from workbench.harness.workloads import BenchRequest, Workload

    rng = random.Random(seed)
    ins = LengthDist("lognormal", p50=256, p95=1024, max=4096).sample(rng, num_requests)
    outs = LengthDist("lognormal", p50=128, p95=512, max=4096).sample(rng, num_requests)
    pool = list(range(1000, 33000))
    reqs = tuple(BenchRequest(f"r{i}", [pool[rng.randrange(len(pool))] for _ in range(n)], m)
                 for i, (n, m) in enumerate(zip(ins, outs, strict=True)))
    return Workload("sim-speed", seed, {"num_requests": num_requests}, reqs)


def one(instances: int, rate: float, seconds: float, keep_trace: bool = True
        ) -> dict[str, Any]:
    """One run in this process: its figures (printed as one JSON line by --one)."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.watched import watched
    from workbench.sim.simulator import simulate
    from workbench.sim.target import make_instances

    n = max(1, round(rate * seconds))
    wl = workload(n)
    sims, _ = make_instances({**TARGET, "num_instances": instances}, ENGINE)
    arrival = ArrivalSpec(mode="poisson", rate=rate, seed=0)
    box: dict[str, float] = {}

    def run() -> Any:
        t0, c0 = time.perf_counter(), _cpu_s()
        res = simulate(wl, arrival, sims, "least_outstanding", keep_step_trace=keep_trace)
        box["wall_s"], box["cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
        return res

    res, validity = watched(run, "sim-speed", max_other_cpu_share=None)
    wall = box["wall_s"]
    steps = sum(inst.steps for inst in sims)
    ok = sum(r.success for r in res.records)
    return {"instances": instances, "rate": rate, "seconds": seconds, "requests": n,
            "step_trace": keep_trace,
            "succeeded": ok, "steps": steps, "simulated_s": res.duration_s, "wall_s": wall,
            "requests_per_wall_s": n / wall, "steps_per_wall_s": steps / wall,
            "simulated_s_per_wall_s": res.duration_s / wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "own_cpu_s_per_wall_s": box["cpu_s"] / wall,
            "other_cpu_share": validity.other_cpu_share}


def _cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def child(instances: int, rate: float, seconds: float, keep_trace: bool = True
          ) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--one", str(instances), str(rate),
                           str(seconds), *(() if keep_trace else ("--no-step-trace",))],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"sim_speed: the run {instances} x {rate} req/s x {seconds} s "
                         f"failed:\n{proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def line(r: dict[str, Any], label: str = "") -> str:
    share = r["other_cpu_share"]
    others = "?" if share is None else f"{share:.0%}"
    return (f"{label}{r['instances']:>3} inst  {r['rate']:>6g} req/s  {r['seconds']:>6g} s  "
            f"{r['requests']:>7} req  {r['steps']:>9} steps  wall {r['wall_s']:8.1f} s  "
            f"{r['requests_per_wall_s']:8.1f} req/s  {r['steps_per_wall_s']:8.0f} steps/s  "
            f"{r['simulated_s_per_wall_s']:6.2f}x real time  peak {r['peak_rss_mib']:7.0f} MiB"
            f"  (this run had {r['own_cpu_s_per_wall_s']:.0%} of a core; other processes "
            f"took {others} of the {os.cpu_count()} CPUs)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", nargs=3, type=float, metavar=("INSTANCES", "RATE", "SECONDS"))
    ap.add_argument("--no-sizes", action="store_true", help="only the largest run")
    ap.add_argument("--largest-scale", type=float, default=1 / 120,
                    help="the share of the hour the largest run simulates (1.0: all of it); "
                         "below 1 it runs at the scale and twice it and extrapolates")
    ap.add_argument("--out", help="write every figure as JSON")
    ap.add_argument("--no-step-trace", action="store_true",
                    help="the largest run (and --one) without the per-step trace "
                         "(simulate(keep_step_trace=False)): its memory is then the requests'")
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1], args.one[2],
                             keep_trace=not args.no_step_trace)))
        return 0
    if not 0 < args.largest_scale <= 1:
        raise SystemExit(f"--largest-scale ({args.largest_scale}) must be in (0, 1]")
    figures: dict[str, Any] = {"sizes": [], "largest": None}
    for size in () if args.no_sizes else SIZES:
        r = child(*size)
        figures["sizes"].append(r)
        print(line(r), flush=True)
    inst, rate, hour = LARGEST
    if args.largest_scale >= 1:
        r = child(inst, rate, hour, keep_trace=not args.no_step_trace)
        figures["largest"] = {"measured": r}
        print(line(r, "largest, measured: "))
    else:
        a = child(inst, rate, hour * args.largest_scale, keep_trace=not args.no_step_trace)
        b = child(inst, rate, hour * args.largest_scale * 2, keep_trace=not args.no_step_trace)
        for r in (a, b):
            print(line(r, "largest, scaled: "), flush=True)
        est = {}
        for key in ("wall_s", "peak_rss_mib", "steps"):
            slope = (b[key] - a[key]) / (b["seconds"] - a["seconds"])
            est[key] = a[key] + slope * (hour - a["seconds"])
        figures["largest"] = {"scaled": [a, b], "extrapolated": est}
        print(f"largest, EXTRAPOLATED from the two scaled runs to {hour:g} s of {rate:g} req/s "
              f"over {inst} instances ({round(rate * hour)} requests): wall "
              f"{est['wall_s']:.0f} s ({est['wall_s'] / 3600:.2f} h), peak "
              f"{est['peak_rss_mib'] / 1024:.1f} GiB, {est['steps']:.3g} steps")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
