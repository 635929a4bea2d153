"""Results folders: what `workbench run`, `workbench bench` and `workbench sweep` leave on disk.

    results/<name>/<UTC timestamp>/     at the checkout's root (git-ignored), or under
                                        --results-dir ROOT / $WORKBENCH_RESULTS_DIR
      runs.csv, runs.json               one row per run (sweep: per point): labels + metrics
      VERDICT.md | summary.md           the table the console printed (run | bench, sweep)
      sweep.png                         run: the plot also logged to MLflow (sweep.png)
      traces/*.json.gz                  run --profile torch: one gzip Chrome trace per run
      notebooks/*.ipynb                 sweep: the executed notebooks
      requests.csv                      bench: one row per request

The folder name is the UTC start time (20261130T142501Z); a second folder started within the
same second gets a "-2" suffix, so nothing is overwritten. Rows may have different keys: the
CSV's columns are the leading keys in order, then every metric name sorted.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.experiments.path_names import check_path_name

RESULTS_ENV = "WORKBENCH_RESULTS_DIR"
RUNS_CSV, RUNS_JSON = "runs.csv", "runs.json"


def default_root() -> Path:
    """$WORKBENCH_RESULTS_DIR, else `results/` at the root of this checkout (the folder
    holding pyproject.toml above the package), else `results/` in the working directory."""
    env = os.environ.get(RESULTS_ENV, "")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "workbench").is_dir():
        return checkout / "results"
    return Path.cwd() / "results"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:80] or "results"


def new_results_dir(name: str, root: str | Path | None = None,
                    now: datetime | None = None) -> Path:
    """Create and return <root>/<name>/<UTC timestamp>/ (root: `default_root()`);
    ValueError for a name that is a path (`path_names`: `..`, `a/b`, `/x`)."""
    check_path_name("experiment name", name)
    base = (Path(root) if root is not None else default_root()) / slug(name)
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base.mkdir(parents=True, exist_ok=True)
    for i in range(1, 1000):
        folder = base / (stamp if i == 1 else f"{stamp}-{i}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder.resolve()
    raise RuntimeError(f"could not create a results folder under {base}")


def columns(rows: Sequence[dict[str, Any]], leading: Sequence[str]) -> list[str]:
    rest = sorted({k for r in rows for k in r} - set(leading))
    return [*leading, *rest]


def _cell(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return ""
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True, default=str)
    return "" if v is None else v


def write_rows(folder: str | Path, rows: Sequence[dict[str, Any]],
               leading: Sequence[str]) -> tuple[Path, Path]:
    """runs.csv and runs.json in `folder`: every row, columns `leading` then the rest."""
    folder = Path(folder)
    cols = columns(rows, leading)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({c: _cell(r.get(c)) for c in cols})
    (folder / RUNS_CSV).write_text(buf.getvalue())

    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    data = [{k: clean(v) for k, v in r.items()} for r in rows]
    (folder / RUNS_JSON).write_text(json.dumps(data, indent=2, default=str) + "\n")
    return folder / RUNS_CSV, folder / RUNS_JSON


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def text_table(rows: Iterable[dict[str, Any]], cols: Sequence[str]) -> str:
    """A Markdown table (pipes, aligned columns) of `cols` from `rows`."""
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) + " |"
            for row in cells]
    return "\n".join([line, rule, *body])


RUN_COLUMNS = ("variable", "value", "repeat", "run_id", "status", "valid", "disturbed",
               "other_cpu_share", "error", "node", "fingerprint")
VERDICT_MD = "VERDICT.md"  # capitals: listed first


def experiment_rows(variable: str, runs: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per run (`runner.RunRecord`): RUN_COLUMNS, then its metrics."""
    return [{"variable": variable, "value": r.label, "repeat": r.repeat + 1,
             "run_id": r.run_id, "status": "FAILED" if r.error else "FINISHED",
             "valid": r.valid, "disturbed": r.disturbed, "other_cpu_share": r.other_cpu_share,
             "error": r.error, "node": r.node, "fingerprint": r.fingerprint, **r.metrics}
            for r in runs]


def write_experiment_results(folder: Path, template: Any, runs: Sequence[Any],
                             table: str) -> None:
    """`workbench run`'s folder: VERDICT.md (the console's table), runs.csv, runs.json
    (sweep.png and traces/ are written where they are made)."""
    (folder / VERDICT_MD).write_text(f"# {template.name}\n\n{template.question}\n\n{table}\n")
    write_rows(folder, experiment_rows(template.variable_name, runs), RUN_COLUMNS)
