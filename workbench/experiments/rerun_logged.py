"""What a logged run says, and the rerun written beside it (`workbench rerun`'s store side).

Place in the flow: `experiments/rerun.py` asks `find_run` what RUN_ID is (an experiment's
parent or child, a sweep point; a rerun stands for the run it reran), rebuilds the template
with `logged_template` (or, for a sweep point, the notebook parameters with
`restored_defaults`), checks `fingerprint_warnings`, measures, compares (`compare`, i.e.
`experiments.drift`) and hands the `RerunResult` to `finish`, which logs the rerun run's
metrics, tags and files and writes the results folder.
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import UserError
from workbench.experiments.drift import Drift, drift
from workbench.experiments.results import new_results_dir, write_rows

PARENT_TAG = "mlflow.parentRunId"
VALIDITY_METRICS = ("valid", "other_cpu_share")  # `Store.log_validity`'s, never compared
KINDS = ("experiment-child", "experiment", "sweep-point")


@dataclass
class Logged:
    """The run to reproduce as the store has it (mlflow `Run`s)."""

    kind: str  # one of KINDS
    run: Any
    parent: Any  # the experiment's parent run (itself for a parent), or the sweep's
    experiment: str


@dataclass
class RerunResult:
    run_id: str  # the new rerun run
    rerun_of: str
    kind: str
    experiment: str
    tracking_uri: str
    rows: list[Drift]
    table: str  # `drift_table(rows)`
    summary: str  # `drift.summary_line` and `drift.noise_line`, two lines
    verdict: str  # same | drifted | failed
    measured: list[dict[str, Any]]  # one row per new run: label, run_id, status, metrics
    warnings: list[str] = field(default_factory=list)  # fingerprint / git sha differ
    notes: list[str] = field(default_factory=list)  # what was adjusted or not checkable
    workload_checksum: str | None = None
    results_dir: Path | None = None

    @property
    def failed(self) -> bool:
        return self.verdict == "failed" or any(m["status"] == "FAILED" for m in self.measured)


def find_run(client: Any, run_id: str, uri: str) -> Logged:
    """The run and what kind of run it is; `UserError` for an unknown id or a run that is
    neither an experiment run nor a sweep point."""
    run = _get(client, run_id, uri, "run id")
    tags = run.data.tags
    if tags.get("role") == "rerun" and tags.get("rerun_of"):
        run = _get(client, tags["rerun_of"], uri, f"rerun_of of run {run_id}")
        tags = run.data.tags
    parent_id = tags.get(PARENT_TAG)
    parent = _get(client, parent_id, uri, f"the parent of run {run_id}") if parent_id else None
    parent_kind = parent.data.tags.get("kind") if parent is not None else None
    if tags.get("kind") == "experiment":
        kind, parent = "experiment", run
    elif tags.get("kind") == "sweep-point" and parent_kind == "sweep":
        kind = "sweep-point"
    elif tags.get("role") in ("baseline", "variant") and parent_kind == "experiment":
        kind = "experiment-child"
    else:
        raise UserError(
            f"run {run_id} (kind {tags.get('kind')!r}, role {tags.get('role')!r}) is neither "
            "an experiment run (a `workbench run` parent, or its child with role baseline or "
            "variant) nor a sweep point (kind sweep-point): nothing to rerun")
    experiment = client.get_experiment(run.info.experiment_id).name
    return Logged(kind, run, parent, experiment)


def _get(client: Any, run_id: str, uri: str, what: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as e:
        raise UserError(f"{what} ({run_id!r}) is not a run in {uri}") from e


def absolute_uri(uri: str) -> str:
    """A relative sqlite URI made absolute (a notebook runs in its own folder)."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


# ----------------------------------------------------------------- shared by both kinds
def fingerprint_warnings(logged_fingerprint: str | None, logged_sha: str | None,
                         preflight: dict[str, Any]) -> list[str]:
    """One line per difference between the logged hardware fingerprint / git sha and now."""
    out = []
    now = preflight["fingerprint"]
    if logged_fingerprint and logged_fingerprint != now:
        out.append(f"hardware fingerprint {now} differs from the logged {logged_fingerprint}: "
                   "the numbers are not directly comparable (`workbench preflight --compare "
                   "OLD.json` names the fields; the run's preflight.json is an artifact of its "
                   "experiment's parent run)")
    sha = str(preflight.get("git_sha"))
    if logged_sha and logged_sha != sha:
        out.append(f"git sha {sha[:12]} differs from the logged {logged_sha[:12]}: the code "
                   f"changed since the run (git diff {logged_sha[:12]})")
    return out


def say(prefix: str, lines: list[str]) -> None:
    for line in lines:
        print(f"workbench rerun: {prefix}: {line}", file=sys.stderr, flush=True)


def compare(config: str, center: dict[str, float], logged: list[dict[str, float]],
            new: list[dict[str, float]], metrics: list[str], method: str) -> list[Drift]:
    """Rows for one configuration: every metric in `metrics` that was logged (`center`) and,
    unless no new run succeeded, measured again."""
    rows = []
    for m in metrics:
        if m not in center or (new and not any(m in n for n in new)):
            continue
        rows.append(drift(config, m, center[m], [s[m] for s in logged if m in s],
                          [n[m] for n in new if m in n], method))
    return rows


def rerun_tags(logged: Logged, preflight: dict[str, Any]) -> dict[str, str]:
    return {"kind": "rerun", "role": "rerun", "rerun_of": logged.run.info.run_id,
            "rerun_kind": logged.kind, "hardware_fingerprint": preflight["fingerprint"],
            "git_sha": str(preflight.get("git_sha"))}


def finish(store: Any, result: RerunResult, new_metrics: dict[str, float],
           csv_rows: list[dict[str, Any]], leading: list[str], out: Path) -> RerunResult:
    """Log the rerun run's metrics, verdict and files; write the results folder."""
    title = (f"# rerun of {result.kind} run {result.rerun_of}\n\n"
             f"experiment {result.experiment}, {len(result.measured)} new run(s), MLflow run "
             f"{result.run_id}\n")
    lines = [f"warning: {w}" for w in result.warnings] + [f"note: {n}" for n in result.notes]
    md = "\n".join([title, *lines, "", result.table, "", result.summary, ""])
    data = {"rerun_of": result.rerun_of, "run_id": result.run_id, "kind": result.kind,
            "experiment": result.experiment, "verdict": result.verdict,
            "warnings": result.warnings, "notes": result.notes,
            "workload_checksum": result.workload_checksum,
            "rows": [r.as_dict() for r in result.rows], "measured": result.measured}
    text = json.dumps(data, indent=2, default=str) + "\n"
    store.log_metrics(result.run_id, new_metrics)
    store.log_files(result.run_id, {"rerun.md": md, "rerun.json": text})
    store.set_tags(result.run_id, {"rerun_verdict": result.verdict})
    store.set_description(result.run_id, md)
    store.finish(result.run_id, failed=result.failed)
    (out / "rerun.md").write_text(md)
    (out / "rerun.json").write_text(text)
    write_rows(out, csv_rows, leading)
    result.results_dir = out
    return result


def results_folder(logged: Logged, root: Path) -> Path:
    return new_results_dir(f"{logged.experiment}-rerun", root)


def median_metrics(rows: list[Drift], keyed: bool) -> dict[str, float]:
    """The new medians as the rerun run's metrics (`<metric>/<label>` when `keyed`)."""
    from workbench.experiments.labels import metric_label

    return {(f"{r.metric}/{metric_label(r.config)}" if keyed else r.metric): r.now
            for r in rows if r.now is not None}


# ----------------------------------------------------------------- small parsers
def parse_logged(text: str) -> Any:
    """A logged param's value (`Store.log_params` wrote non-strings as JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def literal(source: str) -> Any:
    try:
        return ast.literal_eval(source)
    except (ValueError, SyntaxError):
        return source


def restored_defaults(nb: Path, param: str, chosen: dict[str, Any],
                      logged_params: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The notebook parameters whose default changed since the point ran, at their logged
    values ({name: value}), and a note for each. Only parameters the sweep logged (under
    their knob keys, `param_keys.notebook_params`) are compared."""
    import papermill

    from workbench.tracking.mlflow_store import flatten
    from workbench.tracking.param_keys import notebook_params

    declared = {name: literal(str(spec.get("default")))
                for name, spec in papermill.inspect_notebook(str(nb)).items()}
    merged = {**declared, **chosen}
    keys = dict(zip(merged, notebook_params(merged, swept=param), strict=False))
    restored: dict[str, Any] = {}
    notes = []
    for name, default in declared.items():
        key = keys.get(name, name)
        if name in chosen or key not in logged_params or isinstance(default, dict):
            continue
        now, then = flatten({key: default})[key], logged_params[key]
        if now != then:
            restored[name] = then if isinstance(default, str) else parse_logged(then)
            notes.append(f"notebook parameter {name}: its default is now {now}, the point ran "
                         f"with {then}; rerun with {then}")
    return restored, notes


def template_from_params(params: dict[str, str]) -> dict[str, Any]:
    """The raw template from a parent run's `template.*` params (`Store.log_params` flattened
    it: nested keys joined by ".", non-strings as JSON)."""
    raw: dict[str, Any] = {}
    for key, text in sorted(params.items()):
        head, _, path = key.partition(".")
        if head != "template" or not path:
            continue
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = parse_logged(text)
    return raw


def logged_template(client: Any, parent: Any) -> Any:
    """The experiment's template: the parent's template.yaml artifact, else its params."""
    from mlflow.exceptions import MlflowException

    from workbench.experiments.template import parse_template

    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent.info.run_id, "template.yaml", tmp)
            raw = yaml.safe_load(Path(path).read_text())
        except (MlflowException, OSError):
            raw = template_from_params(parent.data.params)
    if not raw:
        raise UserError(f"template of run {parent.info.run_id}: neither a template.yaml "
                        "artifact nor template.* params were logged; nothing to rerun")
    return parse_template(raw)
