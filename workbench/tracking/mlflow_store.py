"""MLflow tracking: where runs land and how one benchmark run is written.

Default store: `sqlite:///<cwd>/mlruns/mlflow.db` with artifacts under `mlruns/artifacts/`
(for any sqlite store, beside the database file)
(MLflow 3.17's file store refuses to start). `MLFLOW_TRACKING_URI` or an explicit `uri`
points elsewhere (e.g. a shared `mlflow server`). Open the results with `workbench ui`
(`mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db` bound to 127.0.0.1).

Everything goes through `MlflowClient` with explicit run ids (no global active run), so a
failing child run is terminated FAILED without disturbing its parent.

Every measured run (experiment child, `workbench bench`, sweep point) says whether it can be
trusted the same way (`log_validity`): tags `run_valid` ("true" | "false") and `validity`
(the reasons, or "valid"), `max_other_cpu_share` (the threshold, when judged); metrics `valid`
(1.0 | 0.0) and `other_cpu_share` (the share of all CPUs other processes used meanwhile).
Find the untrustworthy ones with `tags.run_valid = 'false'`.

Every experiment this package creates or opens carries the tag `mlflow.experimentKind =
custom_model_development` (`EXPERIMENT_KIND`), so MLflow 3's UI opens it on the runs table
with metric columns rather than the GenAI "Evaluation runs" view. A run's description (the
UI's "Description" box) is its `mlflow.note.content` tag (`Store.set_description`).

Secrets never reach the store (`harness.redact`): a param or tag under a secret-named key
(`target.api_key`, `hf_token`, ...) is logged as "***", a command line's `--api-key X` as
`--api-key ***`, and every secret value the store has seen is replaced in later tags, files
and descriptions (the template's YAML, an error message). Artifact names stay inside the run
(no absolute path, no `..`).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from workbench.harness.redact import redact, redact_text, secret_values


def tracking_uri(uri: str | None = None) -> str:
    """The explicit uri, else $MLFLOW_TRACKING_URI, else the local sqlite store (created)."""
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    root = Path.cwd() / "mlruns"
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def artifact_location(uri: str, experiment_name: str) -> str | None:
    """For a sqlite store, artifacts live beside the database (`<db dir>/artifacts/<name>`,
    the name as one folder: `/` and `\\` become `_`, a name of dots is prefixed with `_`);
    otherwise (a server) the server decides."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///"):])
    folder = re.sub(r"[/\\\x00]", "_", experiment_name) or "_"
    if set(folder) == {"."}:
        folder = "_" + folder
    return (db.parent / "artifacts" / folder).resolve().as_uri()


def artifact_name(name: str) -> str:
    """`name` if it is a relative path that stays inside the run's artifacts, else
    ValueError naming it."""
    p = Path(name)
    if not name or p.is_absolute() or ".." in p.parts or name.startswith("~"):
        raise ValueError(f"artifact name ({name!r}) must be a relative path inside the run "
                         "(no leading /, no '..')")
    return name


KIND_TAG = "mlflow.experimentKind"  # read by MLflow 3's UI to pick the experiment's view
EXPERIMENT_KIND = "custom_model_development"  # runs table with metric columns (not GenAI)
NOTE_TAG = "mlflow.note.content"  # a run's description in the UI


def ensure_kind(client: Any, experiment_id: str) -> None:
    """Tag the experiment as `EXPERIMENT_KIND` unless someone chose a kind for it (a kind
    the UI only inferred, "..._inferred" or "no_inferred_type", is replaced)."""
    kind = (client.get_experiment(experiment_id).tags or {}).get(KIND_TAG)
    if kind is None or kind.endswith("_inferred") or kind == "no_inferred_type":
        client.set_experiment_tag(experiment_id, KIND_TAG, EXPERIMENT_KIND)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}; lists and None as JSON."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v, default=str)
    return out


class Store:
    """One MLflow experiment; creates parent and child runs and writes their content."""

    def __init__(self, experiment_name: str, uri: str | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(uri)
        mlflow.set_tracking_uri(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(experiment_name)
        if exp is None:
            self.experiment_id = self.client.create_experiment(
                experiment_name, artifact_location=artifact_location(self.uri, experiment_name)
            )
        else:
            self.experiment_id = exp.experiment_id
        ensure_kind(self.client, self.experiment_id)
        self.secrets: set[str] = set()  # secret values seen: redacted in any later text

    def _clean(self, value: Any) -> Any:
        """`value` redacted (secret-named keys, secret flags, the secrets seen so far)."""
        self.secrets |= secret_values(value)
        out = redact(value)
        return redact_text(out, self.secrets) if isinstance(out, str) else out

    def _text(self, text: str) -> str:
        return redact_text(text, self.secrets)

    def create_run(
        self, name: str, tags: dict[str, str] | None = None, parent_id: str | None = None
    ) -> str:
        all_tags = {k: self._text(v) if isinstance(v, str) else v
                    for k, v in self._clean(dict(tags or {})).items()}
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        return run.info.run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = flatten(self._clean(params))
        items = [Param(k[:250], self._text(v)[:6000]) for k, v in sorted(flat.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in self._clean(tags).items():
            self.client.set_tag(run_id, k, self._text(v if isinstance(v, str) else json.dumps(v)))

    def set_description(self, run_id: str, text: str) -> None:
        """The run's description in the MLflow UI (markdown)."""
        self.client.set_tag(run_id, NOTE_TAG, self._text(text))

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(_metric_name(k), float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        ]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def log_series(self, run_id: str, rows: Iterable[dict[str, Any]], keys: list[str],
                   step_key: str = "step", prefix: str = "step.") -> None:
        """Step-indexed metrics (e.g. running, waiting, KV usage per engine step)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(prefix + k, float(r[k]), now, int(r[step_key]))
            for r in rows for k in keys if k in r
        ]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def log_files(self, run_id: str, files: dict[str, str | bytes]) -> None:
        """Write {relative name: content} to a temp dir and upload it as artifacts."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, content in files.items():
                p = Path(tmp) / artifact_name(name)
                p.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    p.write_bytes(content)
                else:
                    p.write_text(self._text(content))
            self.client.log_artifacts(run_id, tmp)

    def log_artifact(self, run_id: str, path: str | Path, subdir: str | None = None) -> None:
        """Upload the file at `path` (a text file with a secret seen: a redacted copy)."""
        if subdir is not None:
            artifact_name(subdir)
        path = Path(path)
        if self.secrets and path.is_file() and path.suffix in _TEXT_SUFFIXES:
            text = path.read_text(errors="replace")
            if self._text(text) != text:
                with tempfile.TemporaryDirectory() as tmp:
                    copy = Path(tmp) / path.name
                    copy.write_text(self._text(text))
                    self.client.log_artifact(run_id, str(copy), subdir)
                return
        self.client.log_artifact(run_id, str(path), subdir)

    def log_validity(self, run_id: str, valid: bool, reasons: Sequence[str] = (),
                     other_cpu_share: float | None = None,
                     max_other_cpu_share: float | None = None) -> None:
        """The run's validity under the names in the module docstring."""
        tags = {"run_valid": "true" if valid else "false",
                "validity": "; ".join(reasons)[:5000] or "valid"}
        if max_other_cpu_share is not None:
            tags["max_other_cpu_share"] = f"{max_other_cpu_share:g}"
        self.set_tags(run_id, tags)
        metrics = {"valid": float(valid)}
        if other_cpu_share is not None:
            metrics["other_cpu_share"] = other_cpu_share
        self.log_metrics(run_id, metrics)

    def finish(self, run_id: str, failed: bool = False) -> None:
        self.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")

    def kill(self, run_id: str, error: str) -> None:
        """End a run KILLED (interrupted: its numbers are incomplete), tag `error` why."""
        self.client.set_tag(run_id, "error", error[:5000])
        self.client.set_terminated(run_id, status="KILLED")

    def kill_running(self, tag: str, value: str, error: str) -> list[str]:
        """Mark KILLED (tag `error`) the runs of this experiment still RUNNING whose `tag`
        is `value` (a try whose node died: tag executor_attempt); their ids."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{tag}` = '{value}' and attributes.status = 'RUNNING'",
            max_results=100)
        for r in runs:
            self.client.set_tag(r.info.run_id, "error", error[:5000])
            self.client.set_terminated(r.info.run_id, status="KILLED")
        return [r.info.run_id for r in runs]


_TEXT_SUFFIXES = (".md", ".txt", ".json", ".yaml", ".yml", ".csv", ".log", ".ipynb", ".html")


def _metric_name(name: str) -> str:
    # MLflow allows alphanumerics, _ - . space / ; vLLM's "vllm:xxx" becomes "vllm/xxx".
    return name.replace(":", "/")
