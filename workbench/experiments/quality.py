"""The quality gate: does a candidate engine config still say what the reference config says?

    ref  = reference("demo", {"dtype": "float32"})               # once per baseline
    rep  = evaluate("demo", {"dtype": "float32", "quantization": "int4"}, ref)
    ok, reasons = rep.passes({"min_token_agreement": 0.9, "max_ppl_increase_pct": 2.0,
                              "max_mean_kl": 0.02, "min_top1_agreement": 0.95})

Four figures, each measured through OUR engine's public API (`LLM.generate` with
`SamplingParams(prompt_logprobs=k)`, so the quantized linear layers and the paged KV cache are
in them), the candidate against the reference config on the same model. The scoring itself is
`workbench.harness.scoring`:

- **perplexity** on held-out text: the demo corpus's held-out split (every HOLDOUT_EVERY-th
  `.py` file of this Python's standard library, see `workbench.testing.demo_pair`), tokenized with
  the model's own tokenizer (each file as "<s> ... </s>"), first `ppl_tokens` + 1 tokens, cut
  into non-overlapping windows of `context` tokens (at most max_model_len - 1); every token
  after the first is predicted once, from the actual token's prompt logprob. For the trained
  demo model this text was never trained on; for other models it is just a fixed text that
  ships with Python. Same windows as `workbench.testing.demo_pair.score`.
- **greedy agreement** on a golden prompt set: both configs generate `max_tokens` greedy
  tokens (ignore_eos) through `LLM.generate`; identical tokens at identical positions / all
  tokens, and the first divergence position per prompt (None = identical).
- **mean KL(p_ref || p_cand)** and **top-1 agreement** of the next-token distributions at the
  positions of the reference's greedy continuations, teacher-forced: prompt + the
  reference's tokens go through both models with prompt_logprobs=-1 (the whole vocabulary),
  so a divergence does not change what is scored. Also the top-1 agreement over the held-out
  text positions (more positions, less noise).

Teacher-forced continuation positions are scored by a prefill where generation scored them by
decode steps: the same math over the same cached K/V, in a different kernel (on CPU the
decode path may be a C++ kernel whose float sums differ in the last bits).

Thresholds and options: `workbench.experiments.quality_report`. In an experiment template the
`quality_gate` block holds them:

    quality_gate: {min_token_agreement: 0.9, max_ppl_increase_pct: 1.0, max_mean_kl: 0.01,
                   min_top1_agreement: 0.95, num_prompts: 4, max_tokens: 16,
                   ppl_tokens: 4096, ppl_context: 512}

There the golden prompt set is the workload's first `num_prompts` prompts; KL / top-1
agreement and held-out perplexity are measured only when the gate has a threshold on them.

A `needle` block adds passkey retrieval (`workbench.experiments.needle`): the grid's cases are
built once with the reference, run on the reference and on each candidate through the same
engine instance as the other figures, and the candidate's exact-match accuracy must reach
`min_accuracy`:

    quality_gate: {min_token_agreement: 0.5, num_prompts: 4,
                   needle: {min_accuracy: 0.9, lengths: [256, 1024], depths: [0, 0.5, 1]}}

Greedy agreement cannot tell a KV eviction policy that drops the one line that matters from
one that does not; the needle grid can (docs/kv_compression.md, `## Quality gate`).
Engine knobs that only change scheduling (budgets, caching, block size) must give agreement
1.0; lossy ones (quantization, an fp8 KV cache) are judged against the thresholds. A variant
that misses one is never adopted (`verdict._adopt`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.experiments.quality_report import (
    GATE_KEYS,
    OPTIONS,
    THRESHOLDS,
    QualityReport,
    check_gate,
    needs,
)
from workbench.harness.scoring import (
    DEFAULT_CONTEXT,
    DEFAULT_PPL_TOKENS,
    GOLDEN_PROMPTS,
    TextScore,
    agreement,
    continuation_logprobs,
    generate_greedy,
    golden_prompts,
    greedy_tokens,
    held_out_ids,
    kl_and_top1,
    score_text,
)

if TYPE_CHECKING:
    from workbench.engine.llm import LLM

__all__ = [
    "DEFAULT_CONTEXT", "DEFAULT_MAX_TOKENS", "DEFAULT_PPL_TOKENS", "GATE_KEYS", "GOLDEN_PROMPTS",
    "OPTIONS", "THRESHOLDS", "QualityReport", "Reference", "TextScore", "agreement",
    "check_gate", "evaluate", "gate_reports", "generate_greedy", "golden_prompts",
    "greedy_tokens", "held_out_ids", "judge_variants", "needs", "quality_failures",
    "reference", "score_text",
]

DEFAULT_MAX_TOKENS = 32


@dataclass
class Reference:
    """What the reference config produced; reused against every candidate."""

    model: str
    config: dict[str, Any]
    prompts: list[list[int]]
    max_tokens: int
    tokens: list[list[int]]  # its greedy continuations
    logprobs: list[torch.Tensor] | None = field(default=None, repr=False)  # teacher-forced
    text: TextScore | None = None  # held-out text score (None: perplexity not measured)
    text_ids: list[int] | None = field(default=None, repr=False)
    context: int = DEFAULT_CONTEXT
    needle_cases: list[Any] | None = field(default=None, repr=False)  # NeedleCase, built once
    needle_accuracy: float | None = None
    seconds: float = 0.0


Log = Callable[[str], None] | None


@contextmanager
def _step(log: Log, what: str) -> Iterator[None]:
    """`log(what ...)` before the step and `log(... done in X s)` after it (None: silent)."""
    if log is None:
        yield
        return
    log(f"quality gate: {what} ...")
    t0 = time.perf_counter()
    yield
    log(f"quality gate: {what}: {time.perf_counter() - t0:.1f} s")


def _windows(n_tokens: int, context: int) -> str:
    n = max(1, -(-max(n_tokens - 1, 1) // max(context, 1)))
    return f"{n} window(s) of {context} tokens"


def _llm(model: str, config: dict[str, Any] | LLM) -> tuple[LLM, dict[str, Any]]:
    from workbench import LLM

    if isinstance(config, LLM):
        return config, {}
    return LLM(model, **config), dict(config)


def _needle_grid(model: str, block: dict[str, Any]) -> list[Any]:
    """The cases of a gate's `needle` block (its grid options, the task's defaults)."""
    from workbench.experiments.needle import needle_cases
    from workbench.testing import needle_cases as nc

    return needle_cases(
        model, block.get("lengths", nc.DEFAULT_LENGTHS), block.get("depths", nc.DEFAULT_DEPTHS),
        int(block.get("cases_per_cell", nc.DEFAULT_CASES_PER_CELL)),
        int(block.get("seed", nc.DEFAULT_SEED)))


def _run_needle(llm: LLM, cases: list[Any]) -> Any:
    """A NeedleReport of `cases` on `llm`."""
    from workbench.experiments.needle import NeedleReport, run_cases

    return NeedleReport("", {}, [], [], 0, 0, run_cases(llm, cases))


def reference(
    model: str | Path,
    config: dict[str, Any] | LLM | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    ppl_tokens: int | None = DEFAULT_PPL_TOKENS,
    context: int = DEFAULT_CONTEXT,
    kl: bool = True,
    needle: dict[str, Any] | None = None,
    log: Log = None,
) -> Reference:
    """Run the reference config (default: the model in float32, unquantized): its greedy
    continuations of `prompts` (default: `golden_prompts`), their teacher-forced
    log-probabilities (when `kl`), its held-out text score (`ppl_tokens` None: skipped) and,
    with a gate's `needle` block, its needle accuracy (the cases kept for the candidates).
    `log` (e.g. print) hears each step and its time."""
    t0 = time.perf_counter()
    model = str(model)
    with _step(log, "reference: load the engine"):
        llm, cfg = _llm(model, {"dtype": "float32"} if config is None else config)
    prompts = golden_prompts(model) if prompts is None else [list(p) for p in prompts]
    with _step(log, f"reference: {len(prompts)} greedy prompt(s) x {max_tokens} tokens"):
        tokens = generate_greedy(llm, prompts, max_tokens)
    ref = Reference(model, cfg, prompts, max_tokens, tokens, context=context)
    if kl:
        with _step(log, "reference: teacher-forced next-token distributions"):
            ref.logprobs = continuation_logprobs(llm, prompts, tokens)
    if ppl_tokens:
        ref.text_ids = held_out_ids(model, ppl_tokens)
        with _step(log, f"reference: perplexity, {_windows(len(ref.text_ids), context)}"):
            ref.text = score_text(llm, ref.text_ids, context)
    if needle:
        ref.needle_cases = _needle_grid(model, needle)
        with _step(log, f"reference: needle, {len(ref.needle_cases)} case(s)"):
            ref.needle_accuracy = _run_needle(llm, ref.needle_cases).accuracy
    ref.seconds = time.perf_counter() - t0
    return ref


def evaluate(
    model: str | Path,
    candidate: dict[str, Any] | LLM,
    ref: Reference | None = None,
    *,
    baseline: dict[str, Any] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    ppl_tokens: int | None = DEFAULT_PPL_TOKENS,
    context: int = DEFAULT_CONTEXT,
    kl: bool = True,
    needle: dict[str, Any] | None = None,
    log: Log = None,
    label: str = "candidate",
) -> QualityReport:
    """The candidate config (or a built, idle LLM) against `ref` (built here from `baseline`,
    default float32 unquantized, when not given; the keyword options then apply). What the
    reference measured is what the report holds."""
    model = str(model)
    if ref is None:
        ref = reference(model, baseline, prompts, max_tokens=max_tokens, ppl_tokens=ppl_tokens,
                        context=context, kl=kl, needle=needle)
    t0 = time.perf_counter()
    with _step(log, f"{label}: load the engine"):
        llm, cfg = _llm(model, candidate)
    with _step(log, f"{label}: {len(ref.prompts)} greedy prompt(s) x {ref.max_tokens} tokens"):
        tokens = generate_greedy(llm, ref.prompts, ref.max_tokens)
    agr = agreement(ref.tokens, tokens)
    rep = QualityReport(
        model=model, reference_config=ref.config, candidate_config=cfg,
        num_prompts=len(ref.prompts), max_tokens=ref.max_tokens,
        token_agreement=agr["token_agreement"], first_divergence=agr["first_divergence"],
        identical_sequences=agr["identical_sequences"],
    )
    if ref.logprobs is not None:
        with _step(log, f"{label}: teacher-forced next-token distributions"):
            cand = continuation_logprobs(llm, ref.prompts, ref.tokens)
        rep.mean_kl, rep.max_kl, rep.top1_agreement = kl_and_top1(ref.logprobs, cand)
    if ref.text is not None and ref.text_ids is not None:
        with _step(log, f"{label}: perplexity, {_windows(len(ref.text_ids), ref.context)}"):
            text = score_text(llm, ref.text_ids, ref.context)
        rep.ppl_tokens = text.tokens
        rep.reference_perplexity = ref.text.perplexity
        rep.perplexity = text.perplexity
        rep.text_top1_agreement = (
            float((text.argmax == ref.text.argmax).float().mean()) if text.tokens else 1.0)
    if ref.needle_cases is not None:
        with _step(log, f"{label}: needle, {len(ref.needle_cases)} case(s)"):
            found = _run_needle(llm, ref.needle_cases)
        rep.needle_accuracy, rep.needle_num_cases = found.accuracy, len(found.results)
        rep.reference_needle_accuracy = ref.needle_accuracy
        rep.needle_worst_cells = found.worst_cells()
    rep.seconds = time.perf_counter() - t0
    return rep


# ----------------------------------------------------------------------------- experiments


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
    log: Log = None,
    labels: dict[Any, str] | None = None,
) -> tuple[dict[Any, list[str]], dict[Any, dict[str, Any]]]:
    """Judge every variant config against the baseline under `gate`:
    ({value: failure sentences}, {value: QualityReport.as_dict()}). A variant (or the
    baseline) that cannot run fails its gate with the error; nothing is raised. `log`
    (e.g. print) hears each step (reference / candidate, prompts, perplexity) and its time;
    `labels` names the values in it (value -> short label, e.g. "k=5")."""
    want = needs(gate)
    max_tokens = int(gate.get("max_tokens", 16))
    try:
        ref = reference(
            model, baseline, prompts, max_tokens=max_tokens, kl=want["kl"],
            ppl_tokens=int(gate.get("ppl_tokens", DEFAULT_PPL_TOKENS))
            if want["perplexity"] else None,
            context=int(gate.get("ppl_context", DEFAULT_CONTEXT)),
            needle=gate.get("needle") if want["needle"] else None, log=log,
        )
    except Exception as e:  # noqa: BLE001 - no reference: no variant can pass
        why = f"quality reference (baseline) could not run: {type(e).__name__}: {e}"
        return {v: [why] for v in variants}, {}
    failures: dict[Any, list[str]] = {}
    reports: dict[Any, dict[str, Any]] = {}
    for value, config in variants.items():
        try:
            name = (labels or {}).get(value, value)
            rep = evaluate(model, config, ref, log=log, label=f"candidate {name}")
        except Exception as e:  # a variant that cannot run fails its gate, nothing else
            failures[value] = [f"quality check could not run: {type(e).__name__}: {e}"]
            continue
        failures[value] = quality_failures(rep, gate)
        reports[value] = rep.as_dict()
    return failures, reports


def judge_variants(
    model: str | Path,
    configs: dict[str, dict[str, Any]],
    *,
    gate: dict[str, Any] | None = None,
    num_prompts: int = len(GOLDEN_PROMPTS),
    max_tokens: int = DEFAULT_MAX_TOKENS,
    ppl_tokens: int | None = DEFAULT_PPL_TOKENS,
    context: int = DEFAULT_CONTEXT,
) -> tuple[list[dict[str, Any]], dict[str, QualityReport]]:
    """Every config against the first (the reference) on `golden_prompts`: one table row per
    config (`QualityReport.row()` plus "gate": pass / FAIL / - without a gate, and
    "gate_reasons") and the reports. The quality judge `workbench.bench.quant` takes."""
    labels = list(configs)
    ref = reference(model, configs[labels[0]], golden_prompts(model, num_prompts),
                    max_tokens=max_tokens, ppl_tokens=ppl_tokens, context=context,
                    needle=(gate or {}).get("needle"))
    rows, reports = [], {}
    for label in labels:
        rep = evaluate(model, configs[label], ref)
        reports[label] = rep
        ok, reasons = rep.passes(gate or {})
        rows.append({"variant": label, **rep.row(),
                     "gate": ("pass" if ok else "FAIL") if gate else "-",
                     "gate_reasons": "; ".join(reasons)})
    return rows, reports
