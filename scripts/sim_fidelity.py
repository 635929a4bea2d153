"""How close the simulator comes to a measured run: one template run measured (its own
in-process target) and simulated (the same template with `target: {kind: simulated, model,
profile}`), same workload, arrivals, knobs and repeats; one table.

    python scripts/sim_fidelity.py experiments/chunked_prefill_budget.yaml \
        --profile profiles/cpu.json [--repeats 3] [--tracking-uri sqlite:///fid.db]

Per value (the baseline and each variant), the median over repeats of median and p95 TTFT,
median TPOT and output throughput, measured / simulated / relative error; then each
variant's decision on both sides. Issue 33's target: |error| <= 10% on medians, <= 20% on
p95, the same decision. The measured side needs a quiet machine (its runs are judged by the
CPU watch like any other).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import yaml

from workbench.experiments import runner
from workbench.experiments.template import parse_template

METRICS = ("median_ttft_ms", "p95_ttft_ms", "median_tpot_ms", "output_throughput")


def decisions(result: Any) -> dict[str, str]:
    out = {}
    for v in result.verdicts:
        out[str(v.value)] = ("ADOPT" if v.adopted else "undecided" if v.undecided
                             else "inconclusive" if v.inconclusive else "reject")
    return out


def medians(result: Any) -> dict[str, dict[str, float]]:
    by: dict[str, dict[str, list[float]]] = {}
    for r in result.runs:
        if r.error is not None or not r.valid:
            continue
        label = "baseline" if r.value is None else str(r.value)
        for m in METRICS:
            if m in r.metrics:
                by.setdefault(label, {}).setdefault(m, []).append(float(r.metrics[m]))
    return {k: {m: statistics.median(v) for m, v in d.items()} for k, d in by.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("template", type=Path)
    ap.add_argument("--profile", required=True, help="the calibrated profile JSON")
    ap.add_argument("--repeats", type=int, default=None, help="override the template's")
    ap.add_argument("--tracking-uri", default="sqlite:///sim_fidelity.db")
    args = ap.parse_args(argv)
    data = yaml.safe_load(args.template.read_text())
    if args.repeats is not None:
        data["repeats"] = args.repeats
        data.pop("max_repeats", None)
    data.pop("quality_gate", None)  # the simulator emits no text to score
    model = (data.get("target") or {}).get("model", "bundled")
    sim = {**data, "name": f"{data['name']}-simulated",
           "target": {"kind": "simulated", "model": model, "profile": args.profile}}
    measured = runner.run_experiment(parse_template(data), uri=args.tracking_uri)
    simulated = runner.run_experiment(parse_template(sim), uri=args.tracking_uri)
    mm, sm = medians(measured), medians(simulated)
    print(f"\n## {data['name']}: measured vs simulated (profile {args.profile})\n")
    print("| value | metric | measured | simulated | error |")
    print("|---|---|---:|---:|---:|")
    for label, row in mm.items():
        for m in METRICS:
            if m in row and m in sm.get(label, {}):
                a, b = row[m], sm[label][m]
                err = (b - a) / a if a else float("nan")
                print(f"| {label} | {m} | {a:.2f} | {b:.2f} | {err:+.1%} |")
    dm, ds = decisions(measured), decisions(simulated)
    print("\n| variant | measured decision | simulated decision | same |")
    print("|---|---|---|---|")
    for value, d in dm.items():
        print(f"| {value} | {d} | {ds.get(value, '—')} | {'yes' if d == ds.get(value) else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
