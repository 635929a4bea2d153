"""`workbench calibrate`: time this machine's engine on a designed set of batches and fit the
calibrated cost model (`linear_fit.py`) to it; the profile goes to a JSON (`calibrated.py`).

    workbench calibrate --model bundled [--out PATH] [--repeats 3] [--quick] [--serving]
                        [--engine '{"max_num_batched_tokens": 256}']

`--serving` times the steps where templates measure them instead (fixed workloads replayed
through the in-process target; `calibrate_serving.py`): on a 2-core CPU the served steps are
slower than offline ones, and that profile is the one a fidelity comparison should use.
The offline design, below:

The engine (`LLMEngine`, in-process, the model's dtype on CPU: float32) runs the phases of
DESIGN one after the other; each phase adds its requests (random prompt token ids, greedy,
ignore_eos) and steps until they finish:

    prefill     one request at a time, prompts of 16..900 tokens: chunks of several sizes at
                contexts 0, 256, 512, ... (max_num_batched_tokens 256), one sampled row
    batched     several short prompts in one step
    decode      B requests (B = 1, 4, 16, 48) with prompts of 32 or 400 tokens, 24 tokens each:
                after their prefills, pure decode steps of batch B at growing contexts
    mixed       8 decoding requests, then a 700-token prompt arrives: chunked prefill beside
                the decodes

Each step's composition (BatchComposition) follows from every request's computed tokens
before and after the step (`step_composition`, the definitions of `batch.py`); its time is the
step trace row's `duration_s` (the whole step: schedule, forward, sampling, update). Steps
with a preemption, or whose tokens disagree with the trace row, are left out (counted). A
warm-up phase runs first and is not recorded. The design is repeated `repeats` times and
each distinct batch keeps its fastest time (`linear_fit.fastest_per_batch`: noise on a shared
CPU only ever slows a step). The run is watched like a harness run (`harness.watched`: the
CPU share other processes took, judged by the runner's threshold); the profile's `validity`
says whether it was disturbed, and its design section the 1-minute load average before and
after, so a calibration on a busy machine shows as one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from workbench.core.batch_composition import Chunk, from_chunks
from workbench.sim.batch import BatchComposition
from workbench.sim.calibrated import (
    PROFILE_FORMAT,
    CalibratedCostModel,
    default_profile_path,
    profile_key,
)
from workbench.sim.linear_fit import TERMS, FitResult, fastest_per_batch, fit_step_times

# The engine knobs calibration runs with unless told otherwise (prefix caching off: a
# request's computed tokens are then exactly what the steps computed).
ENGINE_DEFAULTS: dict[str, Any] = {"device": "cpu", "enable_prefix_caching": False,
                                   "max_num_batched_tokens": 256, "max_num_seqs": 64, "seed": 0}


@dataclass(frozen=True)
class Phase:
    """Requests added at the phase's start (`prompt_lens`), each generating `max_tokens`;
    `late_prompt_lens` are added after `late_after` steps (a mixed phase)."""

    name: str
    prompt_lens: tuple[int, ...]
    max_tokens: int
    late_prompt_lens: tuple[int, ...] = ()
    late_after: int = 0


def _design(quick: bool) -> tuple[Phase, ...]:
    if quick:
        return (Phase("prefill", (300,), 1), Phase("batched", (24, 40, 56), 1),
                Phase("decode", (32,) * 4, 12), Phase("decode", (200,) * 8, 8),
                Phase("mixed", (48,) * 4, 16, late_prompt_lens=(300,), late_after=3))
    phases = [Phase("prefill", (n,), 1) for n in (16, 64, 130, 256, 600, 900)]
    phases += [Phase("batched", (32,) * 4, 1), Phase("batched", (16, 48, 80, 100), 1)]
    phases += [Phase("decode", (c,) * b, 24) for b in (1, 4, 16, 48) for c in (32, 400)]
    phases += [Phase("mixed", (64,) * 8, 40, late_prompt_lens=(700,), late_after=4)]
    return tuple(phases)


DESIGN = _design(quick=False)
QUICK_DESIGN = _design(quick=True)
WARMUP = Phase("warmup", (40, 40), 4)
# A stored step's row in the profile: the BatchComposition's fields, then its seconds.
STEP_COLUMNS = ("prefill_tokens", "prefill_attn_pairs", "decode_tokens",
                "decode_context_tokens", "num_seqs", "sampled_rows", "draft_tokens",
                "prefill_seqs", "seconds")


def step_composition(before: Mapping[str, int], after: Mapping[str, int],
                     prompt_lens: Mapping[str, int]) -> BatchComposition:
    """One step's BatchComposition from each request's computed tokens before and after it
    (no speculation: a decoding request computes one token and samples one row). A request
    absent from `after` or that did not advance took no part."""
    return from_chunks(
        Chunk(done, n, decoding=done >= prompt_lens[rid],
              samples=done + n >= prompt_lens[rid])
        for rid, done in before.items() if (n := after.get(rid, done) - done) > 0)


@dataclass
class StepLog:
    """What a calibration run kept and left out."""

    samples: list[tuple[BatchComposition, float]]
    skipped_preempted: int = 0
    skipped_mismatch: int = 0


def run_phase(engine: Any, phase: Phase, rng: np.random.Generator, log: StepLog | None,
              prefix: str) -> None:
    """Run one phase on `engine` (an LLMEngine); its steps go to `log` (None: warm-up)."""
    from workbench.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=phase.max_tokens, temperature=0.0, ignore_eos=True)
    vocab = int(engine.vocab_size)
    live: dict[str, Any] = {}

    def add(lens: Sequence[int]) -> None:
        for n in lens:
            rid = f"{prefix}-{len(live)}"
            ids = [int(t) for t in rng.integers(2, vocab, size=n)]
            req = engine.make_request(ids, params, request_id=rid)
            engine.add_request(req)
            live[rid] = req

    add(phase.prompt_lens)
    steps = 0
    while engine.has_unfinished_requests() or (phase.late_prompt_lens and
                                               steps <= phase.late_after):
        if phase.late_prompt_lens and steps == phase.late_after:
            add(phase.late_prompt_lens)
        before = {rid: r.num_computed_tokens for rid, r in live.items() if not r.is_finished()}
        engine.step()
        steps += 1
        if log is None:
            continue
        row = engine.stats.step_trace[-1]
        after = {rid: live[rid].num_computed_tokens for rid in before}
        if row.preemptions or any(after[rid] < before[rid] for rid in before):
            log.skipped_preempted += 1
            continue
        batch = step_composition(before, after, {rid: len(live[rid].prompt_token_ids)
                                                 for rid in before})
        if batch.num_tokens != row.prefill_tokens + row.decode_tokens or batch.num_tokens == 0:
            log.skipped_mismatch += 1
            continue
        log.samples.append((batch, float(row.duration_s)))


def collect_steps(engine: Any, design: Sequence[Phase] = DESIGN, repeats: int = 3,
                  seed: int = 0) -> StepLog:
    """Run WARMUP (unrecorded), then `design` `repeats` times; the kept (batch, seconds)."""
    rng = np.random.default_rng(seed)
    run_phase(engine, WARMUP, rng, None, "warmup")
    log = StepLog(samples=[])
    for r in range(repeats):
        for i, phase in enumerate(design):
            run_phase(engine, phase, rng, log, f"cal{r}-{i}-{phase.name}")
    return log


def build_profile(*, fingerprint: str, cpu: str, device: str, model_name: str, model_key: str,
                  shape: Mapping[str, Any], engine: Mapping[str, Any], fit: FitResult,
                  design: Mapping[str, Any],
                  steps: Sequence[tuple[BatchComposition, float]] = ()) -> dict[str, Any]:
    """The profile JSON's dict (calibrated.py's format); `steps`: the (batch, seconds) the fit
    saw, kept as rows of STEP_COLUMNS (to refit or to plot the residuals later)."""
    return {"format": PROFILE_FORMAT, "source": "calibrated",
            "key": profile_key(fingerprint, model_key),
            "hardware": {"fingerprint": fingerprint, "cpu": cpu, "device": device},
            "model": {"name": model_name, "key": model_key, "shape": dict(shape)},
            "engine": dict(engine), "target": "duration_s", "terms": list(TERMS),
            "coefficients_s": dict(fit.coefficients), "fit": fit.as_dict(),
            "design": dict(design), "step_columns": list(STEP_COLUMNS),
            "steps": [[*(getattr(b, f) for f in STEP_COLUMNS[:-1]), s] for b, s in steps],
            "created": datetime.now(UTC).isoformat(timespec="seconds")}


def calibrate_engine(engine: Any, model_name: str, knobs: Mapping[str, Any],
                     repeats: int = 3, quick: bool = False, heldout_fraction: float = 0.25,
                     seed: int = 0) -> CalibratedCostModel:
    """Run the design on `engine` (an LLMEngine built with `knobs`) and fit; the profile is
    keyed by this machine and the engine's model shape (not yet written)."""
    _check_repeats(repeats)
    design = QUICK_DESIGN if quick else DESIGN
    from workbench.harness.watched import watched

    load_before = os.getloadavg()[0]
    log, validity = watched(lambda: collect_steps(engine, design, repeats=repeats, seed=seed),
                            "workbench calibrate")
    load_after = os.getloadavg()[0]
    distinct = fastest_per_batch(log.samples)
    fit = fit_step_times(distinct, heldout_fraction=heldout_fraction, seed=seed)
    return _profile_model(
        engine.config, model_name, knobs, fit, distinct, validity, target="duration_s",
        design={"mode": "offline", "quick": quick, "repeats": repeats, "seed": seed,
                "phases": [p.name for p in design], "num_steps": len(log.samples),
                "num_distinct_batches": len(distinct),
                "load_average_1m": [load_before, load_after],
                "skipped_preempted": log.skipped_preempted,
                "skipped_mismatch": log.skipped_mismatch})


def calibrate_serving(model_name: str, knobs: Mapping[str, Any], repeats: int = 1,
                      quick: bool = False, heldout_fraction: float = 0.25, seed: int = 0
                      ) -> CalibratedCostModel:
    """Replay the serving design through the in-process target (`calibrate_serving.py`) and
    fit on every kept step's interval; keyed like `calibrate_engine`'s profile."""
    from workbench.harness.watched import watched
    from workbench.sim.calibrate_serving import (
        QUICK_SERVING_DESIGN,
        SERVING_DESIGN,
        collect_serving_steps,
    )

    _check_repeats(repeats)
    design = QUICK_SERVING_DESIGN if quick else SERVING_DESIGN
    load_before = os.getloadavg()[0]
    (steps, config), validity = watched(
        lambda: collect_serving_steps(model_name, knobs, design, repeats=repeats, seed=seed),
        "workbench calibrate --serving")
    load_after = os.getloadavg()[0]
    fit = fit_step_times(steps.samples, heldout_fraction=heldout_fraction, seed=seed,
                         drop_outliers=False)
    return _profile_model(
        config, model_name, knobs, fit, steps.samples, validity, target="step_interval_s",
        design={"mode": "serving", "quick": quick, "repeats": repeats, "seed": seed,
                "runs": [r.describe() for r in design], "num_steps": len(steps.samples),
                "idle_gap_s": steps.idle_gap_s,
                "load_average_1m": [load_before, load_after],
                "skipped_preempted": steps.skipped_preempted,
                "skipped_empty": steps.skipped_empty})


def _check_repeats(repeats: Any) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats ({repeats!r}) must be an integer >= 1")


def _profile_model(config: Any, model_name: str, knobs: Mapping[str, Any], fit: FitResult,
                   steps: Sequence[tuple[BatchComposition, float]], validity: Any, *,
                   target: str, design: Mapping[str, Any]) -> CalibratedCostModel:
    """The profile of a fit on `config`'s engine, keyed by this machine and the model shape."""
    from workbench.config.compile_choice import model_key as shape_key
    from workbench.platforms.cpu_info import cpu_model_name, machine_fingerprint
    from workbench.sim.model_shapes import model_shape

    hf_config: dict[str, Any] = config.model_config.hf_config
    dtype = str(config.torch_dtype_name)
    engine_info = {**knobs, "dtype": dtype, "compilation": config.compilation.describe(),
                   "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens}
    profile = build_profile(
        fingerprint=machine_fingerprint(), cpu=cpu_model_name(), device=str(config.device),
        model_name=model_name, model_key=shape_key(hf_config, dtype),
        shape={**model_shape(hf_config).as_dict(), "name": model_name}, engine=engine_info,
        fit=fit, design=design, steps=steps)
    profile["target"] = target
    profile["validity"] = {"valid": validity.valid, "reasons": list(validity.reasons),
                           "other_cpu_share": validity.other_cpu_share,
                           "max_other_cpu_share": validity.max_other_cpu_share}
    return CalibratedCostModel(profile)


def calibrate(model: str = "bundled", out: str | Path | None = None, repeats: int = 3,
              quick: bool = False, engine_kwargs: Mapping[str, Any] | None = None,
              heldout_fraction: float = 0.25, seed: int = 0, serving: bool = False
              ) -> tuple[CalibratedCostModel, Path]:
    """Build the engine (ENGINE_DEFAULTS under `engine_kwargs`), calibrate it offline
    (`calibrate_engine`) or on the serving path (`serving=True`, `calibrate_serving`), write
    the profile (default: `default_profile_path` of its key, "-serving" before the suffix
    for a serving profile); returns the model and the path."""
    from workbench.engine.llm import LLM

    knobs = {**ENGINE_DEFAULTS, **(engine_kwargs or {})}
    if serving:
        cost_model = calibrate_serving(model, knobs, repeats=repeats, quick=quick,
                                       heldout_fraction=heldout_fraction, seed=seed)
    else:
        with LLM(model, **knobs) as llm:
            cost_model = calibrate_engine(llm.engine, model, knobs, repeats=repeats,
                                          quick=quick, heldout_fraction=heldout_fraction,
                                          seed=seed)
    if out is None:
        path = default_profile_path(str(cost_model.profile["key"]), model)
        out = path.with_name(path.stem + "-serving.json") if serving else path
    path = cost_model.save(out)
    cost_model.path = str(path)
    return cost_model, path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="workbench calibrate",
        description="Fit the simulator's calibrated cost model to this machine's engine.")
    ap.add_argument("--model", default="bundled", help="model folder or shipped name "
                    "(default: bundled)")
    ap.add_argument("--out", default=None, help="profile JSON to write (default: "
                    "<model>-<key hash>.json in $WORKBENCH_SIM_PROFILE_DIR, else "
                    "$WORKBENCH_CACHE_DIR/sim_profiles: where a simulated target's "
                    "`profile: auto` looks)")
    ap.add_argument("--repeats", type=int, default=None, help="times the design runs; "
                    "offline, each distinct batch keeps its fastest time (default 3; "
                    "--serving: 1)")
    ap.add_argument("--quick", action="store_true", help="the small design (a smoke run)")
    ap.add_argument("--heldout-fraction", type=float, default=0.25,
                    help="share of steps held out to measure the fit (default 0.25)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serving", action="store_true", help="time the steps on the serving "
                    "path (fixed workloads replayed through the in-process target, as "
                    "templates measure) instead of offline; --repeats then defaults to 1")
    ap.add_argument("--engine", default=None, metavar="JSON",
                    help="engine knobs over the defaults, e.g. '{\"enforce_eager\": true}'")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    engine_kwargs: dict[str, Any] = {}
    if args.engine:
        try:
            engine_kwargs = json.loads(args.engine)
        except json.JSONDecodeError as e:
            raise ValueError(f"--engine must be a JSON object: {e}") from None
        if not isinstance(engine_kwargs, dict):
            raise ValueError(f"--engine must be a JSON object; got {args.engine!r}")
    repeats = args.repeats if args.repeats is not None else (1 if args.serving else 3)
    model, path = calibrate(args.model, args.out, repeats=repeats, quick=args.quick,
                            engine_kwargs=engine_kwargs,
                            heldout_fraction=args.heldout_fraction, seed=args.seed,
                            serving=args.serving)
    fit = model.profile["fit"]
    print(f"calibrated {args.model} on {model.profile['hardware']['cpu']}: "
          f"{fit['num_train']} training steps ({fit['num_outliers']} outliers dropped), "
          f"{fit['num_heldout']} held out")
    for term in TERMS:
        print(f"  {term:<18} {model.coefficients[term] * 1e6:12.4f} us")
    med, p95 = fit["heldout_median_rel_error"], fit["heldout_p95_rel_error"]
    if med is not None:
        print(f"held-out relative error: median {med:.1%}, p95 {p95:.1%}")
    validity = model.profile["validity"]
    if not validity["valid"]:
        print(f"DISTURBED: {'; '.join(validity['reasons'])}")
    print(f"profile: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
