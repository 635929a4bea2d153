"""One name per knob: notebook 03's parameter reaches SchedulerConfig.max_num_batched_tokens
under the engine's name, through the template, the run's params and the target's engine
kwargs. Notebook 03's cells run in-process as papermill runs them (parameters, then the
injected ones) up to its `run_experiment` call, which hands back the template instead of
measuring; nothing is timed, no engine is started."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from workbench.config import EngineConfig
from workbench.experiments.template import Template
from workbench.harness.server_process import make_target
from workbench.tracking.param_keys import run_params

NB03 = Path(__file__).resolve().parents[2] / "notebooks" / "03_chunked_prefill_sweep.py"
KNOB = "max_num_batched_tokens"


class _Captured(Exception):
    """Raised by the stand-in for run_experiment: the template is in hand."""


def notebook_03_template(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                         **injected: Any) -> Template:
    """The template notebook 03 hands to run_experiment with `injected` as papermill's
    injected parameters (after its parameters cell)."""
    import jupytext

    from workbench.analysis import notebook
    from workbench.experiments import runner

    captured: dict[str, Template] = {}

    def run_experiment(template: Template, **kw: Any) -> None:
        captured["template"] = template
        raise _Captured

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    monkeypatch.setattr(notebook, "ensure_experiment", lambda name, uri: None)
    injected = {"model": "bundled", "mlflow_uri": f"sqlite:///{tmp_path / 'm.db'}",
                **injected}
    namespace: dict[str, Any] = {}
    for cell in jupytext.read(NB03).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith("%"))  # IPython magics
        try:
            exec(compile(source, str(NB03), "exec"), namespace)
        except _Captured:
            return captured["template"]
        if "parameters" in cell.metadata.get("tags", []):
            namespace.update(injected)  # papermill's injected-parameters cell
    raise AssertionError("notebook 03 never called run_experiment")


def parameters_cell() -> list[str]:
    """The names notebook 03's parameters cell assigns."""
    import jupytext

    cell = next(c for c in jupytext.read(NB03).cells
                if "parameters" in c.metadata.get("tags", []))
    return [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)]


def scheduler_budget(template: Template, value: Any) -> tuple[Any, Any, int]:
    """(the run's logged param, the target's engine kwarg, SchedulerConfig's field) of one
    value (None: the baseline), as a run of the template builds them (`child_run`)."""
    config = template.baseline if value is None else template.variant_config(value)
    params = run_params(config, template.workload, template.arrivals)
    target, _ = make_target(template.target, config)
    engine = EngineConfig.from_kwargs(target.model, **target.engine_kwargs)
    return params[KNOB], target.engine_kwargs[KNOB], engine.scheduler_config.max_num_batched_tokens


def test_notebook_03_names_the_knob_as_the_scheduler_does(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert parameters_cell()[1:3] == [KNOB, f"{KNOB}_values"]
    assert not [n for n in parameters_cell() if "budget" in n]
    t = notebook_03_template(monkeypatch, tmp_path, **{KNOB: 256, f"{KNOB}_values": [64, 128]})
    assert t.variable_name == KNOB and t.variable_values == [64, 128]
    assert scheduler_budget(t, None) == (256, 256, 256)
    assert scheduler_budget(t, 64) == (64, 64, 64)
    assert scheduler_budget(t, 128) == (128, 128, 128)


def test_notebook_03_defaults_reach_the_scheduler(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    t = notebook_03_template(monkeypatch, tmp_path)
    assert t.baseline[KNOB] == 512 and t.variable_values == [64, 2048]
    assert scheduler_budget(t, 2048) == (2048, 2048, 2048)


def test_the_old_parameter_names_still_work_with_a_future_warning(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.warns(FutureWarning) as caught:
        t = notebook_03_template(monkeypatch, tmp_path, baseline_budget=256, budgets=[64])
    assert [str(w.message) for w in caught if w.category is FutureWarning] == [
        "notebook parameter baseline_budget is renamed max_num_batched_tokens; "
        "baseline_budget will stop working: pass -p max_num_batched_tokens ...",
        "notebook parameter budgets is renamed max_num_batched_tokens_values; budgets will "
        "stop working: pass -p max_num_batched_tokens_values ..."]
    assert t.baseline[KNOB] == 256 and t.variable_values == [64]
    assert scheduler_budget(t, 64) == (64, 64, 64)


def test_a_sweep_takes_the_old_names_with_a_future_warning() -> None:
    """`workbench sweep notebooks/03... budgets ...`: the old name is accepted with a
    FutureWarning and its values checked as the new one's, before anything runs."""
    import warnings

    from workbench.notebook_params import NotebookParameterError
    from workbench.sweeps.inputs import check_names, check_values, declared_parameters
    from workbench.sweeps.notebook_specs import renamed_parameters

    nb = NB03.with_suffix(".ipynb")
    assert renamed_parameters(nb) == {"baseline_budget": KNOB, "budgets": f"{KNOB}_values"}
    declared = declared_parameters(nb)
    with pytest.warns(FutureWarning) as caught:
        check_names(declared, "budgets", {"baseline_budget": 256}, nb)
    assert [str(w.message) for w in caught] == [
        "notebook parameter budgets of 03_chunked_prefill_sweep.ipynb is renamed "
        "max_num_batched_tokens_values; budgets will stop working: pass "
        "max_num_batched_tokens_values",
        "notebook parameter baseline_budget of 03_chunked_prefill_sweep.ipynb is renamed "
        "max_num_batched_tokens; baseline_budget will stop working: pass "
        "max_num_batched_tokens"]
    with pytest.raises(NotebookParameterError) as refused:
        check_values(nb, declared, "budgets", [[64], [0]], {})
    assert str(refused.value) == (
        "03_chunked_prefill_sweep.ipynb: notebook parameter budgets ([0], a list) must be a "
        "non-empty list, each an integer >= 1 (item 0, 0, is not an integer >= 1); nothing ran")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name: no warning
        check_names(declared, KNOB, {f"{KNOB}_values": [64]}, nb)
    with pytest.raises(ValueError, match=r"\['budget'\] not declared"):
        check_names(declared, "budget", {}, nb)
