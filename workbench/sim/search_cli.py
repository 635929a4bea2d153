"""`workbench sim-search --config search.yaml [--out result.json|.csv] [--workers N | --serial |
--ray [ADDRESS]]`: simulate every configuration of a search spec (workbench/sim/search_spec.py),
print one row per point and the chosen one (workbench/sim/search.py).

Exit status: 0 a point meets the SLO; 1 none does (the table and the --out file are still
written, and the last line names the closest point); 2 the spec or a flag was refused (one
line, `workbench sim-search: ...`).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path
from typing import Any

from workbench.errors import UserError
from workbench.sim.search import ROW_COLUMNS, SearchResult, search
from workbench.sim.search_spec import SearchSpec

# (header, row key, format); None values print as "-"
TABLE: tuple[tuple[str, str, str], ...] = (
    ("#", "index", "d"), ("GPUs", "num_gpus", "d"), ("TP", "tensor_parallel_size", "d"),
    ("PP", "pipeline_parallel_size", "d"), ("inst", "layout", "s"),
    ("budget", "max_num_batched_tokens", "d"), ("seqs", "max_num_seqs", "d"),
    ("in SLO", "slo_attainment", ".1%"), ("goodput/s", "goodput", ".2f"),
    ("p95 TTFT ms", "p95_ttft_ms", ".1f"), ("med TPOT ms", "median_tpot_ms", ".2f"),
    ("meets", "meets", "s"),
)


def load_spec(path: str | Path) -> SearchSpec:
    """The search spec in a YAML file."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"--config ({str(path)!r}) is not a file")
    return SearchSpec.from_dict(yaml.safe_load(p.read_text()))


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    if key == "layout":
        return (f"{row['num_prefill']}:{row['num_decode']}" if row["num_prefill"] is not None
                else str(row["num_instances"]))
    if key == "meets":
        return f"error: {row['error']}" if row["error"] else "yes" if row["meets_slo"] else "no"
    value = row[key]
    return "-" if value is None else format(value, fmt)


def format_table(result: SearchResult) -> str:
    """Every point, one line each; the chosen one marked with `*`."""
    chosen = None if result.chosen is None else result.chosen["index"]
    cells = [[h for h, _, _ in TABLE]] + [[_cell(r, k, f) for _, k, f in TABLE]
                                          for r in result.rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(TABLE) - 1)]
    lines = []
    for n, row_cells in enumerate(cells):
        mark = "*" if n and result.rows[n - 1]["index"] == chosen else " "
        body = [c.rjust(w) for c, w in zip(row_cells[:-1], widths, strict=True)]
        lines.append(f"{mark} " + "  ".join([*body, row_cells[-1]]))
    return "\n".join(lines)


def write_out(result: SearchResult, path: str | Path) -> Path:
    """`.json`: the spec, every row, the chosen row and the verdict; `.csv`: the rows with a
    `chosen` column."""
    out = Path(path)
    if out.suffix not in (".json", ".csv"):
        raise UserError(f"--out ({str(path)!r}) must end in .json or .csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    chosen = None if result.chosen is None else result.chosen["index"]
    if out.suffix == ".json":
        out.write_text(json.dumps({
            "format": "workbench-sim-search/1", "spec": result.spec.as_dict(),
            "backend": result.backend, "rows": result.rows, "chosen": result.chosen,
            "verdict": result.verdict()}, indent=2) + "\n")
        return out
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*ROW_COLUMNS, "chosen"])
        writer.writeheader()
        for r in result.rows:
            writer.writerow({**r, "chosen": r["index"] == chosen})
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench sim-search",
        description="Simulate every configuration of a search spec's grid at the target rate "
                    "and choose the cheapest (fewest GPUs) that meets the goodput SLO "
                    "(docs/simulator_search.md).")
    ap.add_argument("--config", required=True, help="the search spec (YAML)")
    ap.add_argument("--out", help="write the rows: PATH.json (with the spec and the verdict) "
                                  "or PATH.csv")
    fan = ap.add_mutually_exclusive_group()
    fan.add_argument("--workers", type=int, help="local processes (default: the cores)")
    fan.add_argument("--serial", action="store_true", help="run the points in this process")
    fan.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                     help="fan out over Ray: the cluster at ADDRESS (default auto: the "
                          "running one, else a local one for this search)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = load_spec(args.config)
    backend = "ray" if args.ray else "serial" if args.serial else "pool"
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers ({args.workers}) must be >= 1")
    if args.out:  # refuse a bad --out before the points run
        suffix = Path(args.out).suffix
        if suffix not in (".json", ".csv"):
            raise UserError(f"--out ({args.out!r}) must end in .json or .csv")
    t0 = time.perf_counter()
    result = search(spec, backend=backend, workers=args.workers,
                    ray_address=args.ray or "auto")
    wall = time.perf_counter() - t0
    target = spec.target
    print(f"search {spec.name!r}: {target.get('model', 'bundled')} on "
          f"{target.get('hardware') or target.get('profile')}, {len(result.rows)} points "
          f"({result.backend}, {wall:.1f} s wall)")
    print(format_table(result))
    print(result.verdict())
    if args.out:
        print(f"wrote {write_out(result, args.out)}")
    return 0 if result.chosen is not None else 1
