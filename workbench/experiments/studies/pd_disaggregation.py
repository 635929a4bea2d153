"""Notebook 12's measurements through the runner: the colocated vs prefill/decode rate sweep
once per traffic shape, and one instance's prefill and decode capacity per shape.

    shape_template(raw, shape, ...)    the raw pd_disaggregation template re-shaped and scaled
                                       for one shape (`analysis.disagg_runs.SHAPES`)
    shape_num_requests(n, shape)       requests per point for a shape: one count or per shape
    sweep_plan(shapes, rates, quick=)  {shape: the rates to sweep}
    run_shapes(raw, plan, uri, ...)    one rate-sweep experiment per shape ("<name>-<shape>")
    capacity_config(shape, model, ...) `harness.pd_capacity.PDCapacityConfig` at a shape's
                                       mean lengths (rounded)
    capacity_template(config, name)    that measurement as an experiment (see below)
    measure_capacity(shape, model, uri=, threads=1, ...)
                                       -> `PDCapacity` read off that experiment's runs

The capacity experiment replays `batch` requests of the shape's mean prompt and output
lengths (balanced-chat, fixed lengths, all sent at once) on one in-process engine (fp32,
prefix caching off), `repeats` runs each of two decode batches: max_num_seqs = `batch` (the
baseline) and half of it (the variable), so `planning.pd_ratio` gets a curve of decode
tokens/s by batch and takes its best point. Each run's step trace (step_trace.csv) gives
both figures (`harness.pd_capacity`): prefill tokens/s over the steps that scheduled prompt
tokens (of the baseline's runs), decode tokens/s over the decode-only steps. Unlike `workbench
bench pd-capacity`'s separate calls, a prefill step here may carry the decode tokens of the
prompts already prefilled (a few per step against a chunk of prompt tokens). Validity is the
runner's: a run others disturbed makes the figures invalid.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.analysis.disagg_runs import SHAPES, _check_shape, mean_lengths
from workbench.experiments.runner import ExperimentResult
from workbench.experiments.studies.measure import finished_runs, measure
from workbench.harness.pd_capacity import (
    PDCapacity,
    PDCapacityConfig,
    PhaseFigure,
    decode_tok_s,
    prefill_tok_s,
)


def shape_num_requests(num_requests: int | Mapping[str, int] | None,
                       shape: str) -> int | None:
    """Requests per sweep point for `shape`: `num_requests` itself (one count for every
    shape), or its entry for `shape` ({shape: count}; a shape left out gets None: the
    template's count); None stays None. Keys must be SHAPES; counts integers >= 1."""
    _check_shape(shape)
    if num_requests is None:
        return None
    if isinstance(num_requests, Mapping):
        unknown = [k for k in num_requests if k not in SHAPES]
        if unknown:
            raise ValueError(f"num_requests has unknown shapes {unknown}: keys must be some "
                             f"of {', '.join(SHAPES)}")
        n = num_requests.get(shape)
        if n is None:
            return None
    else:
        n = num_requests
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_requests for shape {shape!r} ({n!r}) must be an integer >= 1")
    return n


def shape_template(raw: Mapping[str, Any], shape: str, *, rates: Sequence[float] | None = None,
                   num_requests: int | Mapping[str, int] | None = None,
                   repeats: int | None = None, seed: int | None = None,
                   name: str | None = None) -> dict[str, Any]:
    """A copy of the raw pd_disaggregation template with the shape's lengths (fixture
    balanced-chat), and when given the sweep's `rates`, `num_requests` (one count, or
    {shape: count} per shape: `shape_num_requests`; else the template's), `repeats`, the
    workload and arrival `seed` and the experiment `name` (default: "<name>-<shape>"). Given
    `repeats` are what runs: the template's adaptive rounds (`max_repeats`) are dropped, as
    `analysis.notebook.override_template` drops them."""
    params = _check_shape(shape)
    count = shape_num_requests(num_requests, shape)
    if "rate_sweep" not in raw:
        raise ValueError("raw template has no rate_sweep block: give the pd_disaggregation "
                         "template (or another rate sweep)")
    out = copy.deepcopy(dict(raw))
    workload = out.setdefault("workload", {})
    workload["fixture"] = "balanced-chat"
    workload["params"] = {**workload.get("params", {}), **copy.deepcopy(params)}
    if count is not None:
        workload["params"]["num_requests"] = count
    if seed is not None:
        workload["seed"] = seed
        out["arrivals"] = {**(out.get("arrivals") or {}), "seed": seed}
    if rates is not None:
        out["rate_sweep"] = {**out["rate_sweep"], "rates": [float(r) for r in rates]}
    if repeats is not None:
        out["repeats"] = repeats
        out.pop("max_repeats", None)
    out["name"] = name or f"{raw.get('name', 'pd-disaggregation')}-{shape}"
    return out


def sweep_plan(shapes: Sequence[str], rates: Mapping[str, Sequence[float]], *,
               quick: bool = False) -> dict[str, list[float]]:
    """{shape: the rates to sweep}: `rates[shape]`, or with `quick` only its middle rate
    (one point per layout: a smoke test, no crossing)."""
    if not shapes:
        raise ValueError(f"shapes is empty: give some of {', '.join(SHAPES)}")
    plan = {}
    for shape in shapes:
        _check_shape(shape)
        r = [float(x) for x in rates.get(shape, ())]
        if not r:
            raise ValueError(f"no rates for shape {shape!r}: give increasing requests/s")
        plan[shape] = [r[len(r) // 2]] if quick else r
    return plan


def run_shapes(raw: Mapping[str, Any], plan: Mapping[str, Sequence[float]], uri: str, *,
               target: Any = None, num_requests: int | Mapping[str, int] | None = None,
               repeats: int | None = None, seed: int | None = None,
               name: str | None = None, progress: bool = False) -> dict[str, ExperimentResult]:
    """Run the template once per shape (`shape_template`, experiment "<name>-<shape>") into
    the MLflow store `uri`; {shape: ExperimentResult}. `num_requests`: one count for every
    shape or {shape: count} (a shape left out keeps the template's). `target(spec) -> spec`
    rewrites the target (a notebook passes `targets.local_target` with its port and model)."""
    for shape in plan:  # refuse a bad count before the first shape's sweep starts
        shape_num_requests(num_requests, shape)
    out = {}
    for shape, rates in plan.items():
        shaped = shape_template(raw, shape, rates=rates, num_requests=num_requests,
                                repeats=repeats, seed=seed,
                                name=None if name is None else f"{name}-{shape}")
        if target is not None:
            shaped["target"] = target(shaped["target"])
        out[shape] = measure(shaped, uri, progress=progress)
    return out


def capacity_config(shape: str, model: str, *, num_workers: int = 2, batch: int = 8,
                    repeats: int = 3, seed: int = 0, **engine: Any) -> PDCapacityConfig:
    """The capacity measurement at the shape's mean prompt and output lengths (rounded),
    `batch` decodes at once; `engine` knobs reach the engine."""
    mean_in, mean_out = mean_lengths(shape)
    return PDCapacityConfig(model=model, input_len=round(mean_in), output_len=round(mean_out),
                            batch=batch, num_workers=num_workers, repeats=repeats, seed=seed,
                            engine=dict(engine))


def _half(batch: int) -> int:
    """The variable's decode batch: half the baseline's (2 when the baseline decodes one)."""
    return batch // 2 if batch > 1 else 2


def capacity_template(config: PDCapacityConfig, name: str) -> dict[str, Any]:
    """The capacity measurement as a raw template (see the module docstring)."""
    half = _half(config.batch)
    clients = max(config.batch, half)
    engine = config.engine_kwargs()
    engine["max_model_len"] = max(int(engine["max_model_len"]),
                                  config.input_len + config.output_len)
    engine["max_num_seqs"] = config.batch
    return {
        "name": name,
        "question": (f"How many prompt tokens/s does one instance prefill, and how many output "
                     f"tokens/s does it decode with {config.batch} requests at once against "
                     f"{half}, at {config.input_len} prompt and {config.output_len} output "
                     "tokens? (the inputs of planning.pd_ratio)"),
        "objective": {"metric": "output_throughput", "direction": "maximize"},
        "slo": {"max_error_rate": 0.0},
        "workload": {"fixture": "balanced-chat", "seed": config.seed, "params": {
            "num_requests": clients, "max_input_len": config.input_len,
            "input_len": {"kind": "fixed", "value": config.input_len},
            "output_len": {"kind": "fixed", "value": config.output_len}}},
        "arrivals": {"mode": "closed", "concurrency": clients},
        "target": {"kind": "in-process", "model": config.model},
        "baseline": engine,
        "variable": {"name": "max_num_seqs", "values": [half]},
        "repeats": config.repeats,
        "cache_state": "warm-model",
    }


def measure_capacity(shape: str, model: str, *, uri: str | None = None, threads: int = 1,
                     name: str | None = None, progress: bool = False, **kw: Any) -> PDCapacity:
    """`capacity_template(capacity_config(shape, model, **kw))` through the runner into `uri`
    (None: a throwaway temporary store), with torch held to `threads` intra-op threads (a
    replica's `--replica-threads`), restored after; the figures read off its runs."""
    import torch

    from workbench.analysis.notebook import resolve_tracking_uri

    config = capacity_config(shape, model, **kw)
    raw = capacity_template(config, name or f"pd-capacity-{shape}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = measure(raw, resolve_tracking_uri(uri), progress=progress)
    finally:
        torch.set_num_threads(before)
    return capacity_from(result, config)


def capacity_from(result: ExperimentResult, config: PDCapacityConfig) -> PDCapacity:
    """The figures of a capacity experiment (`capacity_template(config, ...)`)."""
    from workbench import planning
    from workbench.analysis.frames import run_artifact_frame

    figures: dict[str, PhaseFigure] = {}
    decode_curve: dict[int, float] = {}
    for baseline, batch in ((True, config.batch), (False, _half(config.batch))):
        runs = finished_runs(result, baseline)
        if not runs:
            raise RuntimeError(f"{result.name}: every run at max_num_seqs {batch} failed")
        traces = [run_artifact_frame(r.run_id, "step_trace.csv", result.tracking_uri)
                  .to_dict("records") for r in runs]
        phases = {"decode": decode_tok_s} if not baseline else {
            "prefill": prefill_tok_s, "decode": decode_tok_s}
        for phase, read in phases.items():
            rows = [read(trace) for trace in traces]
            if any(seconds <= 0 or tokens == 0 for tokens, seconds, _ in rows):
                raise RuntimeError(f"{result.name}: a run left no {phase} steps in its trace")
            figure = PhaseFigure(phase=phase, batch=batch,
                                 tok_s=tuple(t / s for t, s, _ in rows),
                                 tokens=tuple(int(t) for t, _, _ in rows),
                                 seconds=tuple(float(s) for _, s, _ in rows),
                                 steps=tuple(int(n) for _, _, n in rows))
            if phase == "decode":
                decode_curve[batch] = figure.median_tok_s
            if baseline:
                figures[phase] = figure
    ratio = planning.pd_ratio(config.num_workers, config.input_len, config.output_len,
                              figures["prefill"].median_tok_s, decode_curve,
                              request_rate=config.request_rate)
    shares = [r.other_cpu_share for r in result.runs if r.other_cpu_share is not None]
    return PDCapacity(config, figures["prefill"], figures["decode"], ratio,
                      max(shares) if shares else float("nan"),
                      all(r.valid for r in result.runs if r.error is None))
