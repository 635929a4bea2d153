"""`workbench promote`: the adopted value of a finished experiment as the next baseline.

    promote(template, result, out_path)          after `run_experiment`, in-process
    promote_from_mlflow(parent_run_id, out_path) from a logged experiment (its template.yaml
                                                 and verdicts.json artifacts)

The written template is checked like any other (`validate.check_template`) before it is
written; by default it asks the same question again, the old baseline value among the
values, so the next run re-checks the choice.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml

from workbench.errors import UserError
from workbench.experiments.stages.publish import ExperimentResult
from workbench.experiments.template import Template, parse_template
from workbench.experiments.validate import check_template
from workbench.experiments.validate_engine import knob_default
from workbench.tracking.mlflow_store import tracking_uri


def promoted_template(template: Template, adopted: Any, parent_run_id: str,
                      next_variable: tuple[str, list[Any]] | None = None) -> dict[str, Any]:
    """The template with `variable = adopted` as its new baseline. By default the same
    variable stays, its values the ones not adopted plus the old baseline value (the engine's
    default when the baseline left the knob unset), so the next run re-checks the choice;
    `next_variable=(name, values)` asks the next question instead. `UserError` when no value
    is left to try (the old baseline value was null, e.g. `speculative_config: null`)."""
    raw = template.with_baseline(template.variant_config(adopted))
    raw.pop("variants", None)
    name = template.variable_name
    if next_variable is not None:
        name, values = next_variable[0], list(next_variable[1])
    else:
        old = template.baseline.get(name, knob_default(name))
        values = []
        for v in [old, *template.variable_values]:
            if v is not None and v != adopted and v not in values:
                values.append(v)
        if not values:
            raise UserError(
                f"the promoted template would have no {name} value left to try: "
                f"{name}={adopted!r} becomes the baseline and the old baseline value ({old!r}) "
                "cannot be a variable value; name the next question with "
                "--next-variable NAME --values V1 [V2 ...]")
    raw["variable"] = {"name": name,
                       "values": [dict(v) if isinstance(v, dict) else v for v in values]}
    raw["description"] = (f"promoted from MLflow run {parent_run_id}: "
                          f"{template.variable_name}={adopted}")
    return raw


def write_promoted(raw: dict[str, Any], out_path: str | Path) -> Path:
    """Check the promoted template like any other (`TemplateError` listing its problems,
    nothing written), then write it: what is written runs as the next baseline."""
    dst = Path(out_path)
    check_template(raw, source=f"the promoted template ({dst})",
                   consequence="nothing was written")
    dst.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dst


def promote(template: Template, result: ExperimentResult, out_path: str | Path,
            next_variable: tuple[str, list[Any]] | None = None) -> Path | None:
    """Write the adopted config as the new baseline template; None when nothing was adopted."""
    if result.adopted is None:
        return None
    return write_promoted(promoted_template(template, result.adopted, result.parent_run_id,
                                            next_variable), out_path)


def promote_from_mlflow(parent_run_id: str, out_path: str | Path, uri: str | None = None,
                        next_variable: tuple[str, list[Any]] | None = None) -> Path | None:
    """`workbench promote RUN_ID`: rebuild the promoted template from a finished experiment.
    MLflow's client is imported here, on first use (importing mlflow takes seconds)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(uri))
    run = client.get_run(parent_run_id)
    adopted_tag = run.data.tags.get("adopted")
    if adopted_tag in (None, "none"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tpath = client.download_artifacts(parent_run_id, "template.yaml", tmp)
        template = parse_template(yaml.safe_load(Path(tpath).read_text()))
        vpath = client.download_artifacts(parent_run_id, "verdicts.json", tmp)
        adopted = next(v["value"] for v in json.loads(Path(vpath).read_text()) if v["adopted"])
    return write_promoted(promoted_template(template, adopted, parent_run_id, next_variable),
                          out_path)
