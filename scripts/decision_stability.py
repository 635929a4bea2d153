"""Run each experiment template twice and compare the decisions (issue 31's stability check).

    python scripts/decision_stability.py [TEMPLATE.yaml ...] [--out DIR] [--extra "ARGS"]

Each template runs twice in a row (`workbench run`, its own SQLite MLflow store and results
root under --out), and the decision per value is read from each run's VERDICT.md. Prints one
Markdown row per (template, value): both decisions, whether they agree, and the wall time.
Run it on a quiet machine: a disturbed run is left out of its verdict (inconclusive).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def decisions(verdict_md: Path) -> dict[str, str]:
    """value label -> decision, from a VERDICT.md table (the baseline row left out)."""
    out: dict[str, str] = {}
    head: list[str] | None = None
    for line in verdict_md.read_text().splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "value":  # a table's header (a rate sweep's VERDICT.md has several)
            head = cells
            continue
        if head is None or set(cells[0]) <= {"-"}:
            continue
        if "decision" in head and len(cells) == len(head) and \
                cells[head.index("decision")] != "baseline":
            out[cells[0]] = cells[head.index("decision")]
    return out


def run_once(template: Path, out: Path, tag: str, extra: list[str]) -> tuple[dict[str, str], float]:
    results = out / f"results-{tag}"
    cmd = [str(ROOT / ".venv/bin/workbench"), "run", str(template),
           "--tracking-uri", f"sqlite:///{out / f'mlflow-{tag}.db'}",
           "--results-dir", str(results), *extra]
    t0 = time.monotonic()
    log = out / f"{template.stem}-{tag}.log"
    env = {**os.environ, "PATH": f"{ROOT / '.venv/bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    with log.open("w") as f:  # HTTP templates start `workbench serve|router` from PATH
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode
    wall = time.monotonic() - t0
    found = sorted(results.glob("*/*/VERDICT.md"), key=lambda p: p.stat().st_mtime)
    if rc != 0 or not found:
        return {"(run)": f"exit {rc}, see {log}"}, wall
    return decisions(found[-1]), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("templates", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=Path("/tmp/decision_stability"))
    ap.add_argument("--extra", default="", help="more `workbench run` arguments")
    args = ap.parse_args()
    templates = args.templates or sorted((ROOT / "experiments").glob("*.yaml"))
    args.out.mkdir(parents=True, exist_ok=True)
    print("| template | value | run 1 | run 2 | same | wall s (1, 2) |\n|---|---|---|---|---|---|",
          flush=True)
    for t in templates:
        first, w1 = run_once(t, args.out, f"{t.stem}-1", shlex.split(args.extra))
        second, w2 = run_once(t, args.out, f"{t.stem}-2", shlex.split(args.extra))
        for value in dict.fromkeys([*first, *second]):
            a, b = first.get(value, "-"), second.get(value, "-")
            print(f"| {t.stem} | {value} | {a} | {b} | {'yes' if a == b else 'NO'} | "
                  f"{w1:.0f}, {w2:.0f} |", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
