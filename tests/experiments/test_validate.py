"""The whole template is checked before the first run; every problem is listed at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.experiments.template_dicts import changed
from workbench.errors import TemplateError, UserError
from workbench.experiments.template import load_template, parse_template
from workbench.experiments.validate import check_template, template_problems
from workbench.experiments.validate_engine import ROUTER_KNOBS, ROUTING_POLICIES, engine_knobs

BASE: dict[str, Any] = {
    "name": "t",
    "question": "q?",
    "slo": {"p95_ttft_ms": 1000},
    "workload": {"fixture": "balanced-chat", "seed": 0, "params": {"num_requests": 4}},
    "arrivals": {"mode": "closed", "concurrency": 2},
    "target": {"kind": "in-process", "model": "bundled"},
    "baseline": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
                 "max_num_batched_tokens": 256},
    "variable": {"name": "max_num_batched_tokens", "values": [64, 512]},
    "repeats": 1,
}


def make(**changes: Any) -> dict[str, Any]:
    return changed(BASE, **changes)


def problems(**changes: Any) -> list[str]:
    return template_problems(make(**changes)).problems


def test_a_good_template_has_no_problem_and_its_workload_is_built() -> None:
    checked = template_problems(make())
    assert checked.problems == []
    assert len(checked.workload.requests) == 4


def test_the_issue_example_lists_every_problem_at_once() -> None:
    """A knob typo, a wrong variable.name and an invalid value (64 < the default
    max_num_seqs 256) come back together, with "did you mean"."""
    bad = make(baseline={"dtype": "float32", "max_model_len": 512,
                         "max_num_batched_token": 512},
               variable={"name": "max_num_seq", "values": [8]})
    assert template_problems(bad).problems == [
        "baseline.max_num_batched_token is not an engine knob (did you mean "
        "'max_num_batched_tokens'?)",
        "variable.name (max_num_seq) is not an engine knob (did you mean 'max_num_seqs'?)",
    ]
    bad["variable"] = {"name": "max_num_batched_tokens", "values": [64, 512]}
    assert template_problems(bad).problems == [
        "baseline.max_num_batched_token is not an engine knob (did you mean "
        "'max_num_batched_tokens'?)",
        "variant max_num_batched_tokens=64: max_num_batched_tokens (64) must be >= "
        "max_num_seqs (256); raise it or lower max_num_seqs",
    ]
    with pytest.raises(TemplateError) as e:
        check_template(bad, source="exp.yaml")
    assert str(e.value).splitlines()[0] == "exp.yaml: 2 problems; nothing was run:"
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)


def test_run_experiment_refuses_before_creating_any_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from workbench.experiments.runner import run_experiment

    t = parse_template(make(variable={"name": "max_num_batched_tokens", "values": [4]}))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with pytest.raises(TemplateError, match=r"template 't': 1 problem; nothing was run:\n  - "
                                            r"variant max_num_batched_tokens=4: "
                                            r"max_num_batched_tokens \(4\) must be >= "):
        run_experiment(t, uri=uri, progress=False)
    assert MlflowClient(tracking_uri=uri).get_experiment_by_name("t") is None


@pytest.mark.parametrize(("changes", "expected"), [
    ({"baselin": {}, "baseline": None, "variable": {"name": "max_num_seqs", "values": [4]}},
     ["unknown template key 'baselin' (did you mean 'baseline'?)",
      "template is missing 'baseline'"]),
    ({"repeats": 0, "cache_state": "warm-modle"},
     ["repeats (0) must be an integer >= 1",
      "cache_state ('warm-modle') must be one of cold, warm-model, warm-prefix (did you mean "
      "'warm-model'?)"]),
    ({"objective": {"metric": "p95_itl_ms", "direction": "minimise"}},
     ["objective.direction ('minimise') must be one of minimize, maximize (did you mean "
      "'minimize'?)"]),
    ({"slo": {"p95_ttft": 10, "p95_tpot_ms": -1}},
     ["unknown slo key 'p95_ttft' (did you mean 'p95_ttft_ms'?); allowed: p95_ttft_ms, "
      "p95_tpot_ms, p95_itl_ms, p95_e2el_ms, max_error_rate",
      "slo.p95_tpot_ms (-1) must be a number >= 0"]),
    ({"quality_gate": {"min_token_agreemnt": 1.0, "num_prompts": 0}},
     ["unknown quality_gate key 'min_token_agreemnt' (did you mean 'min_token_agreement'?); "
      "allowed: min_token_agreement, max_ppl_increase_pct, max_mean_kl, min_top1_agreement, "
      "num_prompts, max_tokens, ppl_tokens, ppl_context, needle",
      "quality_gate.num_prompts (0) must be an integer >= 1"]),
    ({"variable": {"name": "max_num_seqs", "values": 16}},
     ["variable.values (16) must be a non-empty list of values to try against the baseline"]),
    ({"variable": {"name": "max_num_seqs", "values": [16, 16]}},
     ["variable.values ([16, 16]) contain duplicates"]),
    ({"max_other_cpu_share": 2}, ["max_other_cpu_share (2) must be a share of the CPUs in "
                                  "[0, 1]"]),
])
def test_plain_fields(changes: dict[str, Any], expected: list[str]) -> None:
    assert problems(**changes) == expected


def test_the_model_folder_is_named_as_target_model(tmp_path: Path) -> None:
    assert problems(target={"kind": "in-process", "model": "dem"}) == [
        "target.model ('dem') is neither a local folder nor a shipped model name (bundled, "
        "demo, demo-draft, needle) (did you mean 'demo'?)"]
    import shutil

    from workbench.config.named_models import bundled_checkpoint

    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bundled_checkpoint() / f, tmp_path / f)
    assert problems(target={"kind": "in-process", "model": str(tmp_path)}) == [
        f"target.model ({str(tmp_path)!r}) has no config.json: not a Hugging Face model folder"]
    (tmp_path / "config.json").write_text("{}")
    assert problems(target={"kind": "in-process", "model": str(tmp_path)}) == [
        f"target.model ({str(tmp_path)!r}) has no *.safetensors weights"]


def test_http_targets_name_the_tokenizer_and_the_command_model() -> None:
    http = {"kind": "http", "base_url": "http://127.0.0.1:1/v1", "model": "served-name",
            "tokenizer": "bundld"}
    assert problems(target=http) == [
        "target.tokenizer ('bundld') is neither a local folder nor a shipped model name "
        "(bundled, demo, demo-draft, needle) (did you mean 'bundled'?) (an http target builds its "
        "prompts with the tokenizer of target.tokenizer, else target.model)"]
    serve = {**http, "tokenizer": "bundled",
             "command": ["workbench", "serve", "--model", "/no/such/dir", "--port", "1"]}
    assert problems(target=serve) == [
        "target.command --model ('/no/such/dir') is neither a local folder nor a shipped model "
        "name (bundled, demo, demo-draft, needle)"]
    assert problems(target={**http, "tokenizer": "bundled", "bse_url": 1}) == [
        "unknown target key 'bse_url' (did you mean 'base_url'?)"]


def test_a_served_engine_is_checked_with_the_commands_own_flags() -> None:
    """`--max-num-seqs 8` in the command makes a budget of 64 valid; without it, the
    server's default (256) refuses it; a foreign server (vLLM) checks its own flags."""
    target = {"kind": "http", "base_url": "http://127.0.0.1:1/v1", "model": "bundled",
              "command": ["workbench", "serve", "--model", "bundled", "--max-num-seqs", "8",
                          "--no-enable-prefix-caching", "--port", "1"]}
    baseline = {"dtype": "float32", "max_model_len": 512}
    ok = make(target=target, baseline=baseline)
    assert template_problems(ok).problems == []
    target["command"] = ["workbench", "serve", "--model", "bundled"]
    assert template_problems(ok).problems == [
        "variant max_num_batched_tokens=64: max_num_batched_tokens (64) must be >= "
        "max_num_seqs (256); raise it or lower max_num_seqs"]
    target["command"] = ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert template_problems(ok).problems == []


def test_a_router_template_keeps_its_own_knobs_apart() -> None:
    target = {"kind": "http", "base_url": "http://127.0.0.1:1/v1", "model": "bundled",
              "command": ["workbench", "router", "--model", "bundled", "--port", "1"]}
    base = {"dtype": "float32", "max_model_len": 512, "policy": "round_robin"}
    assert problems(target=target, baseline=base,
                    variable={"name": "policy", "values": ["prefix_aware"]}) == []
    assert problems(target=target, baseline=base,
                    variable={"name": "policy", "values": ["prefix_awre"]}) == [
        "variant policy='prefix_awre': policy ('prefix_awre') must be one of round_robin, "
        "least_outstanding, prefix_aware (did you mean 'prefix_aware'?)"]
    # in-process, `policy` is the engine's scheduling policy
    assert problems(baseline=base, variable={"name": "max_num_seqs", "values": [4]}) == [
        "baseline: policy ('round_robin') must be one of fcfs, priority"]


def test_the_duplicated_names_match_their_owners() -> None:
    from workbench.engine.arg_utils import engine_knobs as serve_knobs
    from workbench.router.cli import ROUTER_KNOBS as ROUTER
    from workbench.router.policies import POLICIES

    assert ROUTER_KNOBS == ROUTER and set(ROUTING_POLICIES) == set(POLICIES)
    assert set(engine_knobs()) == {k.name for k in serve_knobs()}


@pytest.mark.parametrize(("workload", "expected"), [
    ({"fixture": "long_prefill"}, ["workload.fixture ('long_prefill') is not a fixture (did "
                                   "you mean 'long-prefill'?); fixtures: balanced-chat, "
                                   "long-decode, long-prefill, long_doc_qa, multi_turn_chat, "
                                   "repetitive, shared-prefix"]),
    ({"fixture": "balanced-chat", "param": {}},
     ["unknown workload key 'param' (did you mean 'params'?)"]),
    ({"fixture": "shared-prefix", "params": {"prefix_length": 4}},
     ["unknown workload.params key 'prefix_length' for fixture 'shared-prefix' (did you mean "
      "'prefix_len'?); allowed: max_input_len, max_model_len, num_prefix_groups, "
      "num_requests, output_len, prefix_len, suffix_len"]),
    ({"fixture": "balanced-chat", "params": {"max_input_len": 2048}},
     ["workload: max_input_len (2048) must be < max_model_len (1024) to leave room for "
      "output tokens"]),
    ({"jsonl": "/no/such.jsonl"}, ["workload.jsonl ('/no/such.jsonl') is not a file"]),
    ({"fixture": "balanced-chat", "seed": "0"}, ["workload.seed ('0') must be an integer"]),
])
def test_workload(workload: dict[str, Any], expected: list[str]) -> None:
    assert problems(workload=workload) == expected


def test_every_prompt_must_fit_max_model_len() -> None:
    long = {"fixture": "long-prefill", "params": {"num_requests": 4, "max_input_len": 896,
                                                  "input_len": {"kind": "fixed",
                                                                "value": 600}}}
    assert problems(workload=long) == [
        "baseline: the workload's longest prompt (600 tokens) is longer than max_model_len "
        "(512); lower workload.params.max_input_len or raise max_model_len"]


@pytest.mark.parametrize(("arrivals", "expected"), [
    ({"mode": "poison", "rate": 2}, ["arrivals.mode ('poison') must be one of closed, "
                                     "poisson, gamma, constant, trace (did you mean "
                                     "'poisson'?)"]),
    ({"mode": "poisson", "rat": 2}, ["unknown arrivals key 'rat' (did you mean 'rate'?)"]),
    ({"mode": "closed", "concurrency": 0}, ["arrivals: ArrivalSpec concurrency (0) must be an "
                                            "integer >= 1 for mode 'closed'"]),
])
def test_arrivals(arrivals: dict[str, Any], expected: list[str]) -> None:
    got = problems(arrivals=arrivals)
    assert len(got) == 1 and got[0].startswith(expected[0][:40])
    if not expected[0].startswith("arrivals: "):
        assert got == expected


def test_load_template_names_the_file_and_the_yaml_line(tmp_path: Path) -> None:
    p = tmp_path / "exp.yaml"
    p.write_text("name: t\nquestion: q\nbaseline: {a: 1\nvariable: x\n")
    with pytest.raises(UserError, match=rf"^{p}, line 4 column \d+: not valid YAML: "):
        load_template(p)
    with pytest.raises(UserError, match=r"template \('/no/such.yaml'\) is not a file"):
        load_template("/no/such.yaml")
    p.write_text(yaml.safe_dump(make(variable={"name": "max_num_seq", "values": [4]})))
    with pytest.raises(TemplateError, match=rf"^{p}: 1 problem; nothing was run:\n  - "
                                            r"variable.name \(max_num_seq\) is not an engine "):
        load_template(p)


def test_as_data_round_trips_and_follows_changed_fields() -> None:
    t = parse_template(make(quality_gate={"min_token_agreement": 1.0}))
    again = parse_template(t.as_data())
    assert (again.baseline, again.variable_values, again.quality_gate, again.slo) == (
        t.baseline, t.variable_values, t.quality_gate, t.slo)
    t.variable_values = [4]  # as a notebook may do after parsing: what runs is checked
    assert template_problems(t.as_data()).problems[0].startswith(
        "variant max_num_batched_tokens=4: max_num_batched_tokens (4) must be >= ")
