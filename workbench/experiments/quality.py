"""The experiment's quality gate: does the variant still say what the baseline says?

Greedy agreement on a golden prompt set: both configs generate `max_tokens` greedy tokens
(ignore_eos) for the same prompts; agreement = identical tokens at identical positions /
all tokens, plus the first divergence position per prompt. Engine knobs that only change
scheduling (budgets, caching, block size) must give agreement 1.0; lossy ones (quantization)
are judged against the template's `min_token_agreement`.
"""

from __future__ import annotations

from typing import Any

from workbench.sampling_params import SamplingParams


def greedy_tokens(
    model: str, engine_kwargs: dict[str, Any], prompts: list[list[int]], max_tokens: int
) -> list[list[int]]:
    from workbench import LLM

    llm = LLM(model, **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs]


def agreement(reference: list[list[int]], candidate: list[list[int]]) -> dict[str, Any]:
    same = total = 0
    first_divergence: list[int | None] = []
    for ref, cand in zip(reference, candidate, strict=True):
        n = max(len(ref), len(cand))
        total += n
        diverged = None
        for i in range(n):
            if i < len(ref) and i < len(cand) and ref[i] == cand[i]:
                same += 1
            elif diverged is None:
                diverged = i
        first_divergence.append(diverged)
    return {
        "token_agreement": same / total if total else 1.0,
        "first_divergence": first_divergence,
        "identical_sequences": sum(d is None for d in first_divergence),
    }


def quality_failures(result: dict[str, Any], gate: dict[str, Any]) -> list[str]:
    """Sentences for each gate threshold the result misses (empty = pass)."""
    failures = []
    need = gate.get("min_token_agreement")
    if need is not None and result["token_agreement"] < need:
        failures.append(
            f"greedy token agreement {result['token_agreement']:.3f} < {need} "
            f"(first divergence per prompt: {result['first_divergence']})"
        )
    return failures
