"""One param naming on every path (tracking.param_keys), value labels (experiments.labels),
the experiment kind tag and `workbench ui`'s command and URLs (tracking.ui)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from workbench.cli import COMMANDS
from workbench.experiments.labels import baseline_label, metric_label, value_label
from workbench.tracking.mlflow_store import EXPERIMENT_KIND, KIND_TAG, Store
from workbench.tracking.param_keys import notebook_params, param_key, run_params
from workbench.tracking.ui import compare_url, runs_url, ui_command

SPEC3 = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
SPEC5 = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}


def test_run_params_use_vllm_knob_names() -> None:
    params = run_params({"max_num_batched_tokens": 64, "speculative_config": SPEC5},
                        {"fixture": "balanced-chat", "seed": 3, "params": {"num_requests": 6}},
                        {"mode": "poisson", "rate": 4.0, "seed": 0},
                        cache_state="cold", repeat=1)
    assert params == {"max_num_batched_tokens": 64, "speculative_method": "ngram",
                      "num_speculative_tokens": 5, "speculative_prompt_lookup_max": 4,
                      "request_rate": 4.0, "arrival_mode": "poisson", "arrival_seed": 0,
                      "workload": "balanced-chat", "workload_seed": 3, "num_requests": 6,
                      "cache_state": "cold", "repeat": 1}
    assert run_params({"speculative_config": None}, {}, {"mode": "closed", "concurrency": 2}) == {
        "num_speculative_tokens": 0, "arrival_mode": "closed", "concurrency": 2}


def test_notebook_params_map_knob_names_and_the_swept_one_wins() -> None:
    nb03 = {"baseline_budget": 512, "budgets": [64, 2048], "rate": 40.0, "seed": 0}
    assert notebook_params(nb03) == {"max_num_batched_tokens": 512, "budgets": [64, 2048],
                                     "request_rate": 40.0, "seed": 0}
    assert notebook_params(nb03, swept="budgets") == {
        "baseline_budget": 512, "max_num_batched_tokens": [64, 2048], "request_rate": 40.0,
        "seed": 0}
    # a parameter already named by the key keeps it
    assert notebook_params({"block_size": 16, "block_sizes": [8]}) == {
        "block_size": 16, "block_sizes": [8]}
    assert [param_key(n) for n in ("budgets", "engine.max_num_batched_tokens", "arrivals.rate",
                                   "speculative_config.num_speculative_tokens",
                                   "workload.params.num_requests", "concurrency")] == [
        "max_num_batched_tokens", "max_num_batched_tokens", "request_rate",
        "num_speculative_tokens", "num_requests", "concurrency"]


def test_value_labels_are_short_and_never_a_dict_repr() -> None:
    assert value_label("max_num_batched_tokens", 64) == "budget=64"
    assert value_label("budgets", 64) == "budget=64"
    assert value_label("enable_prefix_caching", False) == "prefix_caching=off"
    assert value_label("arrivals.rate", 0.5) == "rate=0.5"
    assert value_label("speculative_config", SPEC5, [SPEC3, SPEC5]) == "k=5"
    assert value_label("speculative_config", SPEC5, [None, SPEC5]) == "method=ngram,k=5"
    assert value_label("kv_transfer_config", {"a": "x" * 50}) == "a=" + "x" * 35 + "..."
    assert value_label("speculative_config", {"method": "draft_model"},
                       [{"method": "ngram"}]) == "method=draft_model"
    assert baseline_label("max_num_batched_tokens", 512) == "baseline (512)"
    assert baseline_label("speculative_config", SPEC3, [SPEC3, SPEC5]) == "baseline (k=3)"
    assert baseline_label("speculative_config", None, [None, SPEC5]) == "baseline (off)"
    assert value_label("kv_cache_dtype", "fp8") == "kv_cache_dtype=fp8"
    assert [metric_label(x) for x in ("budget=64", "baseline (512)", "method=ngram,k=5")] == [
        "budget_64", "baseline_512", "method_ngram_k_5"]


def test_store_tags_new_and_existing_experiments_as_custom_model_development(
        tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("old")  # made before the kind tag existed
    client.set_experiment_tag(old, KIND_TAG, "genai_development_inferred")
    chosen = client.create_experiment("chosen")
    client.set_experiment_tag(chosen, KIND_TAG, "genai_development")  # someone's choice
    for name in ("new", "old", "chosen"):
        Store(name, uri)
    kinds = {n: client.get_experiment_by_name(n).tags[KIND_TAG] for n in ("new", "old", "chosen")}
    assert kinds == {"new": EXPERIMENT_KIND, "old": EXPERIMENT_KIND,
                     "chosen": "genai_development"}
    assert EXPERIMENT_KIND == "custom_model_development"


def test_ui_command_urls_and_verb(tmp_path: Path) -> None:
    db = tmp_path / "mlruns" / "mlflow.db"
    argv = ui_command(f"sqlite:///{db}", port=5123)
    assert argv[1:] == ["-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{db}",
                        "--default-artifact-root", str(db.parent / "artifacts"),
                        "--host", "127.0.0.1", "--port", "5123"]
    with pytest.raises(ValueError, match="database store"):
        ui_command("http://127.0.0.1:5000")
    url = runs_url("http://127.0.0.1:5000", "3", "abc", "p95_itl_ms")
    assert url == ("http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
                   "&searchFilter=tags.mlflow.parentRunId%20%3D%20%27abc%27"
                   "&orderByKey=metrics.%60p95_itl_ms%60&orderByAsc=true")
    assert compare_url("http://h:1", "3", ["b", "a"]) == (
        "http://h:1/#/compare-runs?runs=%5B%22a%22%2C%22b%22%5D&experiments=%5B%223%22%5D")
    assert COMMANDS["ui"][1].__name__ == "call"  # the lazy verb, listed in `workbench --help`
