"""Notebook 07's speculation curve through the runner: speculation off against on at k, one
experiment per concurrency.

    spec_config(method, k, draft_model)   the speculative_config of one point: n-gram prompt
                                          lookup (2..5-gram) or a draft model
    spec_template(model, method, k, concurrency, ...)
                                          experiments/ngram_speculation.yaml asked of `model`
                                          at one concurrency: repetitive traffic, a closed
                                          loop of C (engine max_num_seqs C), baseline off,
                                          variable speculative_config, `runs` repeats, the
                                          greedy-identity quality gate
    measure_spec(model, method, k, concurrencies, ...)
                                          -> [SpecPoint "off", SpecPoint "<method> k=<k>"]
                                          per concurrency ([] at k = 0: off is every other
                                          point's baseline, `analysis.spec.reference_frame`)

Each run starts `workbench serve` (`targets.serve_target`) and the harness reads it over
HTTP, so the spec-decode counters of exactly the measured requests come from the server's
/metrics delta (server_delta.json: drafts, draft tokens, accepted, accepted per position).
A point's wall times are its repeats' durations, its counters its last repeat's; it is
invalid when any of its runs is (`validity`), and "identical" is the quality gate's greedy
token agreement of 1.0 (the variant against the baseline on the workload's first prompts).
"""

from __future__ import annotations

from typing import Any

from workbench.experiments.runner import ExperimentResult
from workbench.experiments.studies.measure import finished_runs, measure
from workbench.experiments.studies.targets import serve_target
from workbench.harness.spec_points import SpecPoint, spec_counters

TEMPLATE = "ngram_speculation.yaml"


def spec_config(method: str, k: int, draft_model: str = "demo-draft") -> dict[str, Any]:
    """The speculative_config of one point: n-gram prompt lookup (2..5-gram) or a draft model."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
                "prompt_lookup_max": 5}
    if method == "draft_model":
        return {"method": "draft_model", "model": draft_model, "num_speculative_tokens": k}
    raise ValueError(f"method ({method!r}) must be 'ngram' or 'draft_model'")


def spec_template(model: str, method: str, k: int, concurrency: int, num_requests: int,
                  seed: int = 0, runs: int = 2, draft_model: str = "demo-draft",
                  port: int | None = None) -> dict[str, Any]:
    """The raw template of one concurrency (see the module docstring): at least 2 x C
    requests, a `workbench serve` of `model` on `port` (None: a free one)."""
    from workbench.analysis.notebook import override_template, raw_template

    if k < 1:
        raise ValueError(f"k ({k}) must be >= 1: k = 0 is speculation off, the baseline")
    out = override_template(
        raw_template("", TEMPLATE), name=f"speculation-{method}-c{concurrency}", seed=seed,
        workload_params={"num_requests": max(num_requests, 2 * concurrency)},
        arrivals={"mode": "closed", "concurrency": concurrency}, repeats=runs,
        values=[spec_config(method, k, draft_model)])
    out["question"] = (f"On repetitive traffic, {concurrency} request(s) at a time, does "
                       f"{method} speculation with k = {k} raise output throughput on {model}, "
                       "with greedy output identical to no speculation?")
    out["target"] = serve_target(model, port)
    out["baseline"] = {**out["baseline"], "max_num_seqs": concurrency}
    return out


def measure_spec(model: str, method: str, k: int, concurrencies: list[int], num_requests: int,
                 seed: int = 0, runs: int = 2, draft_model: str = "demo-draft", *,
                 uri: str, progress: bool = True) -> list[SpecPoint]:
    """At each concurrency C, the experiment `spec_template(...)` into the MLflow store
    `uri`, read back as two SpecPoints ("off" and "<method> k=<k>"); [] at k = 0."""
    if k == 0:
        return []
    points: list[SpecPoint] = []
    for c in concurrencies:
        raw = spec_template(model, method, k, c, num_requests, seed, runs, draft_model)
        points += spec_points(measure(raw, uri, progress=progress), c, f"{method} k={k}", uri)
    return points


def spec_points(result: ExperimentResult, concurrency: int, label: str, uri: str
                ) -> list[SpecPoint]:
    """The baseline ("off") and the variant (`label`) of one speculation experiment."""
    off = _point(result, True, "off", concurrency, uri)
    on = _point(result, False, label, concurrency, uri)
    verdict = next((v for v in result.verdicts if v.value is not None), None)
    if verdict is None:
        raise RuntimeError(f"{result.name}: no verdict ({result.no_verdict})")
    on.identical = not verdict.quality_failures
    return [off, on]


def _point(result: ExperimentResult, baseline: bool, label: str, concurrency: int, uri: str
           ) -> SpecPoint:
    from workbench.analysis.artifacts import run_delta

    runs = finished_runs(result, baseline)
    if not runs:
        errors = {r.error for r in result.runs if (r.value is None) == baseline}
        raise RuntimeError(f"{result.name}: every {label} run failed: {sorted(map(str, errors))}")
    drafts, draft_tokens, accepted, per_pos = spec_counters(run_delta(runs[-1].run_id, uri))
    shares = [r.other_cpu_share for r in runs if r.other_cpu_share is not None]
    return SpecPoint(
        label=label, concurrency=concurrency, run_s=[r.metrics["duration"] for r in runs],
        output_tokens=int(runs[-1].metrics["total_output_tokens"]), num_drafts=drafts,
        num_draft_tokens=draft_tokens, num_accepted=accepted, accepted_per_pos=per_pos,
        others_cpu=max(shares) if shares else float("nan"), valid=all(r.valid for r in runs))
