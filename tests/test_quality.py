"""workbench.experiments.quality: the quality gate of a candidate engine config against the
reference, scored through the public prompt-logprobs API (workbench.harness.scoring).

On the tiny random checkpoint (linear layers with 64 inputs, so int4 takes group size 32):
an identical config is exact (KL 0, agreement 1, same perplexity), int4 drifts by amounts
measured once and asserted as loose bounds, perplexity through the engine equals an
independent transformers computation, and the experiment verdict refuses a variant that
misses its gate.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from workbench import LLM
from workbench.experiments import quality as q
from workbench.testing import tiny_checkpoint

BASE: dict[str, Any] = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 4}
INT4: dict[str, Any] = {**BASE, "quantization": "int4", "quantization_group_size": 32}
STRICT = {"min_token_agreement": 1.0, "max_ppl_increase_pct": 0.0, "max_mean_kl": 0.0,
          "min_top1_agreement": 1.0}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_checkpoint(tmp_path_factory.mktemp("tiny-quality")))


@pytest.fixture(scope="module")
def ref(model: str) -> q.Reference:
    return q.reference(model, BASE, max_tokens=16, ppl_tokens=1024, context=256)


def test_reference_holds_what_it_measured(ref: q.Reference) -> None:
    assert len(ref.prompts) == len(q.GOLDEN_PROMPTS) and ref.max_tokens == 16
    assert all(len(t) == 16 for t in ref.tokens)
    assert ref.logprobs is not None and [lp.shape[0] for lp in ref.logprobs] == [16] * 8
    # teacher-forced scoring reproduces the reference's own greedy picks
    picks = [lp.argmax(-1).tolist() for lp in ref.logprobs]
    assert sum(p == t for p, t in zip(picks, ref.tokens, strict=True)) >= 7
    assert ref.text is not None and ref.text.tokens == 1024 and len(ref.text_ids or []) == 1025


def test_identical_config_is_exact(model: str, ref: q.Reference) -> None:
    rep = q.evaluate(model, dict(BASE), ref)
    assert rep.mean_kl == 0.0 and rep.max_kl == 0.0
    assert rep.top1_agreement == 1.0 and rep.text_top1_agreement == 1.0
    assert rep.token_agreement == 1.0 and rep.identical_sequences == 8
    assert rep.first_divergence == [None] * 8
    assert rep.perplexity == rep.reference_perplexity and rep.ppl_increase_pct == 0.0
    assert rep.passes(STRICT) == (True, [])


def test_int4_group32_drifts_within_measured_bounds(model: str, ref: q.Reference) -> None:
    rep = q.evaluate(model, INT4, ref)
    # measured: mean KL 0.236 (max 1.17), top-1 0.453, greedy agreement 0.055, 0/8
    # identical, perplexity -4.0% (a random model: int4 noise flattens its distributions)
    assert 0.05 < rep.mean_kl < 1.0 and rep.max_kl >= rep.mean_kl
    assert 0.2 < rep.top1_agreement < 0.8
    assert rep.token_agreement < 0.5 and rep.identical_sequences < 8
    assert any(d is not None for d in rep.first_divergence)
    assert rep.perplexity is not None and rep.perplexity != rep.reference_perplexity
    assert rep.ppl_increase_pct is not None and abs(rep.ppl_increase_pct) < 20
    ok, reasons = rep.passes({**STRICT, "max_ppl_increase_pct": 50.0})
    assert not ok and len(reasons) == 3
    assert reasons[0].startswith("greedy token agreement") and "first divergence" in reasons[0]
    assert reasons[1].startswith("mean KL") and reasons[2].startswith("top-1 agreement")
    assert rep.passes({"max_mean_kl": 2.0, "min_top1_agreement": 0.1}) == (True, [])


def test_perplexity_equals_transformers(model: str, ref: q.Reference) -> None:
    """The engine's perplexity (paged prefill, windows of 256) against the transformers model
    on the same windows of the same held-out tokens."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.tensor(ref.text_ids)
    n, nll = len(ids) - 1, 0.0
    with torch.no_grad():
        for s in range(0, n, 256):
            e = min(s + 256, n)
            logits = hf(input_ids=ids[s:e][None]).logits[0].float()
            nll += float(F.cross_entropy(logits, ids[s + 1:e + 1], reduction="sum"))
    assert ref.text is not None
    assert ref.text.perplexity == pytest.approx(math.exp(nll / n), rel=1e-4)


def test_scoring_in_a_small_pool_batches_and_frees(model: str, ref: q.Reference) -> None:
    """Windows (4 of 257 tokens) that do not fit the pool (39 blocks of 16) at once are
    scored by the scheduler in chunks of 128 over several steps; every block goes back, and
    the figures match the big pool's."""
    llm = LLM(model, **{**BASE, "num_gpu_blocks_override": 40, "max_num_batched_tokens": 128})
    kv = llm.engine.scheduler.kv_cache_manager
    free = kv.num_free_blocks
    score = q.score_text(llm, ref.text_ids or [], 256)
    assert kv.num_free_blocks == free and len(llm.step_trace()) >= 4 * 257 // 128
    kv.check_integrity()
    assert ref.text is not None and score.tokens == ref.text.tokens
    assert score.perplexity == pytest.approx(ref.text.perplexity, rel=1e-5)
    assert float((score.argmax == ref.text.argmax).float().mean()) > 0.99
    assert not llm.engine.has_unfinished_requests()
    # the engine still serves afterwards, identically
    assert q.generate_greedy(llm, ref.prompts[:2], 16) == ref.tokens[:2]


def test_gate_rules(model: str, ref: q.Reference) -> None:
    with pytest.raises(ValueError, match="max_kl"):
        q.check_gate({"max_kl": 0.1})
    with pytest.raises(ValueError, match="min_top1_agreement"):
        q.check_gate({"min_top1_agreement": "high"})
    with pytest.raises(ValueError, match="num_prompts"):
        q.check_gate({"num_prompts": 0})
    # a threshold on a figure that was not measured fails, naming it
    greedy_only = q.reference(model, BASE, ref.prompts[:2], max_tokens=4, ppl_tokens=None,
                              kl=False)
    rep = q.evaluate(model, dict(BASE), greedy_only)
    assert rep.mean_kl is None and rep.perplexity is None and rep.token_agreement == 1.0
    ok, reasons = rep.passes({"min_token_agreement": 1.0, "max_mean_kl": 0.1, "num_prompts": 2})
    assert not ok and reasons == ["mean KL(ref || cand) (nats) was not measured (max_mean_kl: 0.1)"]
    assert q.needs({"min_token_agreement": 1}) == {"kl": False, "perplexity": False,
                                                   "needle": False}
    assert q.needs({"max_ppl_increase_pct": 1, "min_top1_agreement": 0.9}) == {
        "kl": True, "perplexity": True, "needle": False}
    assert q.needs({"needle": {"min_accuracy": 0.9}})["needle"] is True


def test_perplexity_equals_the_demo_pair_score(model: str, ref: q.Reference) -> None:
    """`workbench.testing.demo_pair.score` (transformers, its own windows) gives the same
    perplexity and argmax on the same tokens and context."""
    from transformers import AutoModelForCausalLM

    from workbench.testing.demo_pair import score

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        pair = score([hf], torch.tensor(ref.text_ids), context=256)
    assert ref.text is not None and pair.tokens == ref.text.tokens == 1024
    assert ref.text.perplexity == pytest.approx(math.exp(pair.nll[0] / pair.tokens), rel=1e-5)
    ids = torch.tensor(ref.text_ids)
    assert int((ref.text.argmax == ids[1:]).sum()) == pair.correct[0]


def test_old_figures_reproduced(model: str, ref: q.Reference) -> None:
    """Figures the former implementation (a hand-built prefill through the engine's model)
    gave on this checkpoint and these windows: the public API agrees to ~1e-6."""
    assert ref.text is not None
    assert ref.text.perplexity == pytest.approx(4086.6104815598396, rel=1e-5)
    rep = q.evaluate(model, INT4, ref)
    assert rep.perplexity == pytest.approx(3923.175857924295, rel=1e-5)
    assert rep.mean_kl == pytest.approx(0.23584973812103271, rel=1e-4)
    assert rep.max_kl == pytest.approx(1.166861653327942, rel=1e-4)
    assert rep.top1_agreement == 0.453125 and rep.token_agreement == 0.0546875
    assert rep.text_top1_agreement == pytest.approx(0.4423828125, abs=2 / 1024)


def test_held_out_ids_are_the_demo_stream() -> None:
    from workbench.testing import demo_pair as demo

    if not (demo.DEMO_TARGET_DIR / "tokenizer.json").is_file():
        pytest.skip("the demo pair is not built")
    ids = q.held_out_ids("demo", 2048)
    assert ids == demo.held_out_stream(demo.DEMO_TARGET_DIR)[:2049].tolist()


# ----------------------------------------------------------------------------- experiments


def _template(model: str, gate: dict[str, Any]) -> Any:
    from workbench.experiments.template import parse_template

    return parse_template({
        "name": "tiny-quant", "question": "Does int8 keep the tiny model's answers?",
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "workload": {"fixture": "balanced-chat", "seed": 0, "params": {"num_requests": 4}},
        "target": {"kind": "in-process", "model": model},
        "baseline": dict(BASE),
        "variable": {"name": "quantization", "values": ["int8"]},
        "quality_gate": gate,
    })


def test_template_checks_its_quality_gate(model: str) -> None:
    with pytest.raises(ValueError, match="quality_gate key"):
        _template(model, {"min_agreement": 0.9})
    t = _template(model, {"max_mean_kl": 0.01, "ppl_tokens": 512})
    assert t.quality_gate == {"max_mean_kl": 0.01, "ppl_tokens": 512}


def test_verdict_refuses_a_variant_that_fails_the_gate(model: str) -> None:
    """The runner's gate on int8 (tiny random model: greedy agreement ~0.4, KL ~2e-3) fails a
    tight gate, and `decide` then refuses the variant although its objective is better."""
    from workbench.experiments.replay import build_workload
    from workbench.experiments.stages.judge import _quality
    from workbench.experiments.verdict import decide

    gate = {"min_token_agreement": 0.9, "max_mean_kl": 1e-4, "max_ppl_increase_pct": 50.0,
            "num_prompts": 2, "max_tokens": 8, "ppl_tokens": 256, "ppl_context": 128}
    t = _template(model, gate)
    failures, reports = _quality(t, model, build_workload(t, model))
    assert reports["int8"]["mean_kl"] > 1e-4 and reports["int8"]["ppl_tokens"] == 256
    assert any(f.startswith("mean KL") for f in failures["int8"])
    base = [{"output_throughput": 100.0 + i} for i in range(3)]
    better = [{"output_throughput": 200.0 + i} for i in range(3)]
    (v,) = decide(t, base, {"int8": better}, quality=failures)
    assert not v.adopted and v.reason.startswith("quality: ") and "mean KL" in v.reason
    (ok,) = decide(t, base, {"int8": better}, quality={"int8": []})
    assert ok.adopted  # the same numbers without the gate failure are adopted


def test_gate_reports_survive_a_variant_that_cannot_run(model: str, ref: q.Reference) -> None:
    from workbench.experiments.quality import gate_reports

    failures, reports = gate_reports(
        model, BASE, {"bad": {**BASE, "quantization": "int4"}}, ref.prompts[:1],
        {"min_token_agreement": 0.5, "max_tokens": 4})  # int4's default group 128 > 64 inputs
    assert list(reports) == [] and failures["bad"][0].startswith("quality check could not run")


def test_report_dict_and_row(model: str, ref: q.Reference) -> None:
    rep = q.evaluate(model, dict(BASE), ref)
    d = rep.as_dict()
    assert d["ppl_increase_pct"] == 0.0 and d["candidate_config"] == BASE
    row = rep.row()
    assert row["identical_sequences"] == "8/8" and row["mean_kl"] == 0.0
