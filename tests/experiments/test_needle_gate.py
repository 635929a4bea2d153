"""The quality gate's `needle` block: validated up front (template, check_gate), measured on
the baseline and every variant through the same engine instance, and a variant whose passkey
accuracy falls below `min_accuracy` is refused with a sentence naming its worst cells.

The engine is a stub (no model, no timing): it answers a needle prompt with the passkey it
can see in its last `window` tokens (everything without a window), like an engine that kept
only a recent window of the KV cache."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from tests.experiments.template_dicts import changed
from workbench.experiments import quality as q
from workbench.experiments.needle import load_tokenizer
from workbench.experiments.quality_report import QualityReport, check_gate, needs
from workbench.experiments.template import parse_template
from workbench.experiments.validate import template_problems

NEEDLE = {"min_accuracy": 0.9, "lengths": [128, 256], "depths": [0, 0.5, 1],
          "cases_per_cell": 2}
_KEY = re.compile(r"PASSKEY = (\d+)\n")


class StubLLM:
    """`generate` for greedy prompts (fixed tokens) and needle prompts (the passkey found in
    the last `window` tokens, else a wrong one)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.window = config.get("window")
        self.config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=2048))
        self.tok = load_tokenizer("demo")

    def generate(self, prompts: list[dict[str, Any]], params: Any) -> list[Any]:
        plist = params if isinstance(params, list) else [params] * len(prompts)
        outs = []
        for p, sp in zip(prompts, plist, strict=True):
            ids = p["prompt_token_ids"][-self.window:] if self.window else p["prompt_token_ids"]
            m = _KEY.search(self.tok.decode(ids))
            text = f" {m.group(1)}\n" if m else " 11111\n"
            tokens = list(range(2, 2 + sp.max_tokens))
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(
                text=text, token_ids=tokens, error=None)]))
        return outs


@pytest.fixture()
def stub_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(q, "_llm", lambda model, config: (StubLLM(dict(config)), dict(config)))


def test_a_variant_that_loses_the_middle_is_refused(stub_engine: None) -> None:
    gate = {"min_token_agreement": 1.0, "num_prompts": 2, "needle": NEEDLE}
    failures, reports = q.gate_reports("demo", {}, {"full": {"x": 1}, "w64": {"window": 64}},
                                       [[0, 5, 6], [0, 7]], gate)
    assert failures["full"] == []
    assert reports["full"]["needle_accuracy"] == 1.0
    assert reports["full"]["reference_needle_accuracy"] == 1.0
    # only depth 1.0 (the needle right before the question) is in the last 64 tokens
    assert failures["w64"] == [
        "needle accuracy 0.333 < 0.9 over 12 cases (worst cells: length 128 depth 0: 0.00, "
        "length 128 depth 0.5: 0.00, length 256 depth 0: 0.00); baseline 1.000"]
    assert reports["w64"]["needle_accuracy"] == 4 / 12
    assert reports["w64"]["needle_num_cases"] == 12
    assert reports["w64"]["token_agreement"] == 1.0  # greedy agreement alone would pass it


def test_a_baseline_that_cannot_retrieve_is_named(stub_engine: None) -> None:
    gate = {"needle": {**NEEDLE, "lengths": [128], "depths": [0.5]}}
    failures, _ = q.gate_reports("demo", {"window": 32}, {"w16": {"window": 16}}, [[0, 5]],
                                 gate)
    assert failures["w16"] == [
        "needle accuracy 0.000 < 0.9 over 2 cases (worst cells: length 128 depth 0.5: 0.00); "
        "baseline 0.000 (below the bar too: the model does not retrieve; use model: needle)"]


def test_unmeasured_needle_accuracy_fails() -> None:
    rep = QualityReport("m", {}, {}, 1, 4, 1.0, [None], 1)
    assert rep.passes({"needle": {"min_accuracy": 0.5}}) == (
        False, ["needle accuracy was not measured (needle.min_accuracy: 0.5)"])
    rep.needle_accuracy = 0.5
    assert rep.passes({"needle": {"min_accuracy": 0.5}}) == (True, [])
    assert rep.row()["needle_accuracy"] == 0.5


@pytest.mark.parametrize(("block", "msg"), [
    ({}, "quality_gate.needle.min_accuracy is required (the accuracy a variant must reach, "
         "e.g. 0.9)"),
    ({"min_accuracy": 1.5}, "quality_gate.needle.min_accuracy (1.5) must be a number in "
                            "[0, 1]"),
    ({"min_accuracy": 0.9, "lenghts": [128]}, "quality_gate.needle key 'lenghts' is not "
                                               "known; allowed: min_accuracy, lengths, "
                                               "depths, cases_per_cell, seed"),
    ({"min_accuracy": 0.9, "lengths": [32]}, "quality_gate.needle.lengths ([32]) must be a "
                                              "list of integers >= 64 (prompt tokens)"),
    ({"min_accuracy": 0.9, "depths": [2]}, "quality_gate.needle.depths ([2]) must be a list "
                                            "of numbers in [0, 1]"),
    ({"min_accuracy": 0.9, "cases_per_cell": 0}, "quality_gate.needle.cases_per_cell (0) "
                                                  "must be an integer >= 1"),
    (0.9, "quality_gate.needle (0.9) must be a mapping such as {min_accuracy: 0.9}"),
])
def test_bad_needle_blocks_are_refused(block: Any, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        check_gate({"needle": block})
    assert str(e.value) == msg
    base = {"name": "t", "question": "q?", "workload": {"fixture": "balanced-chat", "seed": 0,
                                                         "params": {"num_requests": 2}},
            "target": {"kind": "in-process", "model": "bundled"},
            "baseline": {"dtype": "float32", "max_model_len": 512},
            "variable": {"name": "max_num_seqs", "values": [2]}, "repeats": 1}
    assert template_problems(changed(base, quality_gate={"needle": block})).problems == [msg]


def test_a_template_carries_its_needle_gate() -> None:
    data = {"name": "t", "question": "q?", "workload": {"fixture": "balanced-chat"},
            "baseline": {"dtype": "float32"}, "variable": {"name": "max_num_seqs",
                                                            "values": [2]},
            "quality_gate": {"min_token_agreement": 0.5, "needle": NEEDLE}}
    t = parse_template(data)
    assert t.quality_gate == {"min_token_agreement": 0.5, "needle": NEEDLE}
    assert t.as_data()["quality_gate"]["needle"] == NEEDLE
    assert needs(t.quality_gate) == {"kl": False, "perplexity": False, "needle": True}
