"""The engine's speed before and after a change of structure, side by side on one machine.

    python scripts/before_after.py [--before REV] [--after REV] [--repeats 3]
                                   [--offline-runs 3]

Checks `REV` out into a temporary git worktree and runs, alternating the order every
repeat (before/after, then after/before), in fresh processes with the same interpreter:
- `bench sched`: scheduler + KV manager median ms per step at 256 running requests
  (`workbench.bench.micro.sched.measure`, `workbench.bench.sched_micro` before the move);
- `bench offline` on the engine alone (`--skip-hf --skip-vllm`): output tok/s of the fixed
  64-request workload and ms per token of one request, each a median over its runs.
Prints one Markdown table: the median over repeats of each side and after/before. Runs that
the benchmarks mark disturbed (other processes above their threshold) are left out and
counted. Issue 32 used it with `--before 2080a88` (the last commit before the moves).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHED = """
import json, importlib
for name in ("workbench.bench.micro.sched", "workbench.bench.sched_micro"):
    try:
        mod = importlib.import_module(name)
        break
    except ImportError:
        continue
r = mod.measure()
print("RESULT " + json.dumps({"sched_median_ms": r["median_ms"], "valid": bool(r["valid"])}))
"""


def run_side(root: Path, offline_runs: int, out: Path) -> dict[str, float | None]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    got = subprocess.run([sys.executable, "-c", SCHED], cwd=root, env=env, check=True,
                         capture_output=True, text=True).stdout
    line = next(x for x in got.splitlines() if x.startswith("RESULT "))
    sched = json.loads(line.removeprefix("RESULT "))
    subprocess.run([sys.executable, "-m", "workbench.bench.offline", "--skip-hf",
                    "--skip-vllm", "--runs", str(offline_runs), "--json", str(out)],
                   cwd=root, env=env, check=True, capture_output=True, text=True)
    engine = next(r for r in json.loads(out.read_text())["results"] if r["name"] == "engine")
    return {"sched_median_ms": sched["sched_median_ms"] if sched["valid"] else None,
            "offline_output_tok_s": engine["output_tok_s"] if engine["valid"] else None,
            "single_ms_per_token": engine["single_ms_per_token"] if engine["valid"] else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="2080a88", help="the revision to compare against")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--offline-runs", type=int, default=3)
    ap.add_argument("--after", default=None, help="a revision for the after side (default: "
                    "this working tree, uncommitted changes included)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="wb_before_"))
    before = tmp / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=ROOT,
                   check=True, capture_output=True)
    after = ROOT
    if args.after is not None:
        after = tmp / "after"
        subprocess.run(["git", "worktree", "add", "--detach", str(after), args.after],
                       cwd=ROOT, check=True, capture_output=True)
    rows: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    disturbed = {"before": 0, "after": 0}
    try:
        for i in range(args.repeats):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                root = before if side == "before" else after
                got = run_side(root, args.offline_runs, tmp / f"{side}{i}.json")
                print(f"repeat {i + 1} {side}: {got}", flush=True)
                for key, value in got.items():
                    if value is None:
                        disturbed[side] += 1
                    else:
                        rows[side].setdefault(key, []).append(value)
    finally:
        for tree in {before, after} - {ROOT}:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False, capture_output=True)
    print(f"\n| figure | before ({args.before}) | after ({args.after or 'working tree'}) | "
          "after / before |")
    print("|---|---:|---:|---:|")
    for key in ("sched_median_ms", "offline_output_tok_s", "single_ms_per_token"):
        b, a = rows["before"].get(key, []), rows["after"].get(key, [])
        if not b or not a:
            print(f"| {key} | {b or '—'} | {a or '—'} | — |")
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        print(f"| {key} | {mb:.3f} (n={len(b)}) | {ma:.3f} (n={len(a)}) | {ma / mb:.3f} |")
    print(f"disturbed figures left out: before {disturbed['before']}, after {disturbed['after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
