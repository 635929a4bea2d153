"""The experiment's quality gate: does the variant still say what the baseline says?

The template's `quality_gate` block holds thresholds and options (`workbench.quality`):

    quality_gate: {min_token_agreement: 0.9, max_ppl_increase_pct: 1.0, max_mean_kl: 0.01,
                   min_top1_agreement: 0.95, num_prompts: 4, max_tokens: 16,
                   ppl_tokens: 4096, ppl_context: 512}

Greedy agreement on a golden prompt set (the workload's first `num_prompts` prompts): both
configs generate `max_tokens` greedy tokens (ignore_eos) for the same prompts; agreement =
identical tokens at identical positions / all tokens, plus the first divergence position per
prompt. KL / top-1 agreement (teacher-forced on the baseline's continuations) and held-out
perplexity are measured only when the gate has a threshold on them. Engine knobs that only
change scheduling (budgets, caching, block size) must give agreement 1.0; lossy ones
(quantization, an fp8 KV cache) are judged against the thresholds. A variant that misses one
is never adopted (`verdict._adopt`).
"""

from __future__ import annotations

from typing import Any

from workbench.quality import (
    DEFAULT_CONTEXT,
    DEFAULT_PPL_TOKENS,
    QualityReport,
    agreement,
    evaluate,
    greedy_tokens,
    needs,
    reference,
)

__all__ = ["agreement", "gate_reports", "greedy_tokens", "quality_failures"]


def quality_failures(result: QualityReport | dict[str, Any], gate: dict[str, Any]) -> list[str]:
    """Sentences for each gate threshold the result misses (empty = pass). `result` is a
    QualityReport, or the dict `agreement()` returns (only min_token_agreement applies)."""
    if isinstance(result, QualityReport):
        return result.passes(gate)[1]
    failures = []
    need = gate.get("min_token_agreement")
    if need is not None and result["token_agreement"] < need:
        failures.append(
            f"greedy token agreement {result['token_agreement']:.3f} < {need} "
            f"(first divergence per prompt: {result['first_divergence']})"
        )
    return failures


def gate_reports(
    model: str,
    baseline: dict[str, Any],
    variants: dict[Any, dict[str, Any]],
    prompts: list[list[int]],
    gate: dict[str, Any],
) -> tuple[dict[Any, list[str]], dict[Any, dict[str, Any]]]:
    """Judge every variant config against the baseline under `gate`:
    ({value: failure sentences}, {value: QualityReport.as_dict()}). A variant (or the
    baseline) that cannot run fails its gate with the error; nothing is raised."""
    want = needs(gate)
    max_tokens = int(gate.get("max_tokens", 16))
    try:
        ref = reference(
            model, baseline, prompts, max_tokens=max_tokens, kl=want["kl"],
            ppl_tokens=int(gate.get("ppl_tokens", DEFAULT_PPL_TOKENS))
            if want["perplexity"] else None,
            context=int(gate.get("ppl_context", DEFAULT_CONTEXT)),
        )
    except Exception as e:  # noqa: BLE001 - no reference: no variant can pass
        why = f"quality reference (baseline) could not run: {type(e).__name__}: {e}"
        return {v: [why] for v in variants}, {}
    failures: dict[Any, list[str]] = {}
    reports: dict[Any, dict[str, Any]] = {}
    for value, config in variants.items():
        try:
            rep = evaluate(model, config, ref)
        except Exception as e:  # a variant that cannot run fails its gate, nothing else
            failures[value] = [f"quality check could not run: {type(e).__name__}: {e}"]
            continue
        failures[value] = quality_failures(rep, gate)
        reports[value] = rep.as_dict()
    return failures, reports
