"""The one call every study makes: a raw template through the runner.

    measure(raw, uri)   parse_template(raw), the MLflow experiment created beside a sqlite
                        store (`analysis.notebook.ensure_experiment`), run_experiment ->
                        ExperimentResult

The template is checked in full before any run (`run_experiment` -> `validate`), its runs are
judged and logged like `workbench run`'s, and `results_dir` (a folder) also writes
results/<name>/<UTC time>/ (VERDICT.md, runs.csv, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.experiments.runner import ExperimentResult, run_experiment
from workbench.experiments.template import parse_template


def measure(raw: Mapping[str, Any], uri: str, *, progress: bool = True,
            results_dir: str | Path | None = None) -> ExperimentResult:
    """Run the raw template `raw` into the MLflow store `uri` (see the module docstring)."""
    from workbench.analysis.notebook import ensure_experiment

    template = parse_template(dict(raw))
    ensure_experiment(template.name, uri)
    return run_experiment(template, uri=uri, progress=progress, results_dir=results_dir)


def finished_runs(result: ExperimentResult, baseline: bool) -> list[Any]:
    """The baseline's (or the variants') runs of `result` that did not fail, in run order."""
    return [r for r in result.runs if r.error is None and (r.value is None) == baseline]
