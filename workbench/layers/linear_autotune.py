"""Choosing the CPU linear backend per weight shape: measured at load, cached per machine.

    prepare_linear_weights(model)                 after loading (ModelRunner, via cpu_gemm)
      -> mode: auto, or the backend WORKBENCH_CPU_LINEAR_BACKEND forces
      -> auto: per distinct fp32 CPU weight shape, timings from the cache or measured
         (`measure_wall`), then `choose_plan` -> LinearPlan
      -> every packable layer gets `linear_plan` and `packed_weight` (None without a packed
         backend); returns the packed copies' bytes (the engine's `packed_weight_bytes`)
    linear_backend_report(model, ...)             the engine readout's `linear_backends`

Measuring (`measure_wall`): random fp32 weight [out, in] packed once per backend, inputs of
each probe row count (`linear_backend.PROBE_ROWS`); one warm-up call per backend, then rounds
that call every backend once in turn (a neighbour's burst hits all of them alike), 3 to 25
rounds within ~`budget_s` (20 ms) per probe; the median per backend. The measurement is an
argument (`measure`) so tests inject timings. Weights as the model runs them: a model whose
linear weights exceed the last-level cache streams every weight from memory once per step,
so its shapes are measured *streamed* (each call rotates to another copy of the weight, up
to twice the cache's bytes: `stream_footprint`); a model that fits is measured with the
weight *resident*. The two differ most at 1-16 rows, where a streamed GEMV is bound by
memory: on the 2-core AMD EPYC (Zen 4) of 2026-12-02, 512x512 at 1 row took 27 us resident
on torch and on oneDNN alike, but streamed 137 us on torch and 83 us on oneDNN.

Choosing (`choose_plan`), per shape, at most one packed backend (its copy costs the weight's
bytes): each packed backend p scores the sum over probes of min(t_p, t_torch) / t_torch, where
p only counts at a probe where it is at least MIN_GAIN faster than torch; the lowest score
wins (ties: PACKED_BACKENDS order), and each bucket then uses p where it counted, else torch.
No packed backend at all when none ever counts.

Cache: `linear_backends.json` in $WORKBENCH_CACHE_DIR (default ~/.cache/workbench), keyed by
`machine_key(residency)` (CPU model name, ISA, torch version, thread count, streamed or
resident weights), then shape, then probe:
{"version": 1, "machines": {key: {"1024x512": {"16": {"torch": s, "mkl": s, ...}}}}}. Timings
are cached, not choices, so changing the rule needs no new measurement; a probe or backend
missing from the entry is measured and added. Written atomically (tmp + rename); an unreadable
file counts as empty, an unwritable one is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

import torch
from torch import nn

from workbench.config.compilation import CACHE_ENV as CACHE_ENV  # re-exported: tests set it
from workbench.config.compilation import cache_root
from workbench.layers import linear_backend as lb
from workbench.layers.linear_backend import LinearPlan, Shape
from workbench.platforms.cpu_info import (
    cpu_model_name,
    last_level_cache_bytes,
    machine_fingerprint,
)

CACHE_FILE = "linear_backends.json"
CACHE_VERSION = 1
MIN_GAIN = 0.05  # a packed backend serves a bucket only when this much faster than torch
STREAMED_FALLBACK_LLC = 32 << 20  # the cache size assumed when sysfs does not say
MIN_STREAM_FOOTPRINT = 64 << 20  # the least a streamed measurement rotates through
MAX_STREAM_COPIES = 64  # weight copies per shape, at most, in a streamed measurement
logger = logging.getLogger(__name__)

# shape, probe rows, backends -> {rows: {backend: seconds}}
Measure = Callable[[Shape, Sequence[int], Sequence[str]], dict[int, dict[str, float]]]
Timings = dict[int, dict[str, float]]


# ------------------------------------------------------------------------ machine and cache
def machine_key(weights: str | None = None) -> str:
    """The cache section's key: CPU model, ISA, torch, threads, and (when given) whether the
    timings were taken with the weights streamed from memory or resident in the cache."""
    key = machine_fingerprint(cpu_model_name())
    return key if weights is None else f"{key}; weights={weights}"


def weight_residency(weight_bytes: int, llc_bytes: int | None = None) -> str:
    """"streamed" when the model's linear weights (`weight_bytes`) exceed the last-level cache
    (each step then reads them from memory), else "resident" (an unknown cache size counts as
    STREAMED_FALLBACK_LLC)."""
    llc = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    return "streamed" if weight_bytes > (llc or STREAMED_FALLBACK_LLC) else "resident"


def stream_footprint(weight_bytes: int, llc_bytes: int | None = None) -> int:
    """Bytes of weight copies `measure_wall` rotates through so each call finds its weight
    out of cache, as in a forward of a model that does not fit: the model's own bytes, capped
    at twice the last-level cache (at least MIN_STREAM_FOOTPRINT); 0 for a resident model."""
    llc = last_level_cache_bytes() if llc_bytes is None else llc_bytes
    if weight_residency(weight_bytes, llc) == "resident":
        return 0
    return min(weight_bytes, max(2 * (llc or STREAMED_FALLBACK_LLC), MIN_STREAM_FOOTPRINT))


def default_cache_path() -> Path:
    return cache_root() / CACHE_FILE


def shape_key(shape: Shape) -> str:
    return f"{shape[0]}x{shape[1]}"


class TimingCache:
    """The JSON file of measured timings, one section per machine key."""

    def __init__(self, path: Path | None = None, key: str | None = None) -> None:
        self.path = path if path is not None else default_cache_path()
        self.key = key if key is not None else machine_key()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"version": CACHE_VERSION, "machines": {}}
        except (OSError, ValueError) as e:
            logger.warning("linear backend cache %s unreadable (%s); measuring again",
                           self.path, e)
            return {"version": CACHE_VERSION, "machines": {}}
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            return {"version": CACHE_VERSION, "machines": {}}
        return data

    def get(self, shape: Shape) -> Timings:
        """This machine's cached timings for `shape` ({} when none)."""
        entry = self._read()["machines"].get(self.key, {}).get(shape_key(shape), {})
        return {int(rows): dict(times) for rows, times in entry.items()}

    def put(self, results: dict[Shape, Timings]) -> None:
        """Merge `results` into this machine's section and write the file."""
        data = self._read()
        section = data["machines"].setdefault(self.key, {})
        for shape, timings in results.items():
            entry = section.setdefault(shape_key(shape), {})
            for rows, times in timings.items():
                entry.setdefault(str(rows), {}).update(times)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:
            logger.warning("linear backend cache %s not written (%s)", self.path, e)


# ------------------------------------------------------------------------ measure and choose
def measure_wall(shape: Shape, probes: Sequence[int], backends: Sequence[str], *,
                 clock: Callable[[], float] = time.perf_counter, budget_s: float = 0.02,
                 min_rounds: int = 3, max_rounds: int = 25, stream_bytes: int = 0) -> Timings:
    """Median seconds per call of each backend at each probe row count (module docstring).
    With `stream_bytes` > the weight's own bytes, each backend's calls rotate through that
    many bytes of weight copies (at most MAX_STREAM_COPIES), so a call finds its weight in
    memory rather than in cache, as a forward of a larger-than-cache model does."""
    g = torch.Generator().manual_seed(0)
    weight_bytes = shape[0] * shape[1] * 4
    copies = 1 if stream_bytes <= weight_bytes else min(
        MAX_STREAM_COPIES, -(-stream_bytes // weight_bytes))
    weights = [torch.randn(shape, generator=g) for _ in range(copies)]
    runners = {b: [lb.runner(b, w) for w in weights] for b in backends}
    turn = {b: 0 for b in backends}

    def call(b: str, x: torch.Tensor) -> float:
        run = runners[b][turn[b] % copies]
        turn[b] += 1
        t0 = clock()
        run(x)
        return clock() - t0

    out: Timings = {}
    with torch.inference_mode():
        for rows in probes:
            x = torch.randn(rows, shape[1], generator=g)
            warm = sum(call(b, x) for b in runners)
            rounds = max(min_rounds, min(max_rounds, int(budget_s / max(warm, 1e-9))))
            samples: dict[str, list[float]] = {b: [] for b in runners}
            for _ in range(rounds):
                for b in runners:
                    samples[b].append(call(b, x))
            out[rows] = {b: statistics.median(s) for b, s in samples.items()}
    return out


def choose_plan(shape: Shape, timings: Timings, backends: Sequence[str], source: str,
                tune_s: float = 0.0, min_gain: float = MIN_GAIN) -> LinearPlan:
    """The plan for `shape` from per-probe timings (module docstring); `backends` are the
    available ones (torch always among them)."""
    per_probe = [timings[rows] for rows in lb.PROBE_ROWS]

    def counts(p: str, t: dict[str, float]) -> bool:
        return t[p] < (1.0 - min_gain) * t["torch"]

    best, best_score = None, float(len(per_probe))
    for p in lb.PACKED_BACKENDS:
        if p not in backends:
            continue
        score = sum(t[p] / t["torch"] if counts(p, t) else 1.0 for t in per_probe)
        if score < best_score:
            best, best_score = p, score
    chosen = tuple(best if best is not None and counts(best, t) else "torch" for t in per_probe)
    return LinearPlan(shape, best, chosen, source, tune_s)


def tune_shapes(shapes: Iterable[Shape], backends: Sequence[str], cache: TimingCache,
                measure: Measure) -> dict[Shape, LinearPlan]:
    """A measured-or-cached plan per shape; new measurements are written to the cache."""
    plans: dict[Shape, LinearPlan] = {}
    fresh: dict[Shape, Timings] = {}
    for shape in dict.fromkeys(shapes):
        timings = cache.get(shape)
        missing = [r for r in lb.PROBE_ROWS
                   if any(b not in timings.get(r, {}) for b in backends)]
        tune_s = 0.0
        if missing:
            t0 = time.perf_counter()
            measured = measure(shape, missing, backends)
            tune_s = time.perf_counter() - t0
            fresh[shape] = measured
            for rows, times in measured.items():
                timings.setdefault(rows, {}).update(times)
        plans[shape] = choose_plan(shape, timings, backends,
                                   "measured" if missing else "cache", tune_s)
    if fresh:
        cache.put(fresh)
    return plans


# ------------------------------------------------------------------------ the model
def _packable(module: nn.Module) -> TypeGuard[lb.PackableLinear]:
    """A layer opts in by having a `packed_weight` attribute (LinearBase, ParallelLMHead); a
    quantized one (`quant_method` set) keeps its own forward."""
    return hasattr(module, "packed_weight") and getattr(module, "quant_method", None) is None


def _shape(w: torch.Tensor) -> Shape:
    return (int(w.shape[0]), int(w.shape[1]))


def _fp32_cpu_2d(w: torch.Tensor) -> bool:
    return w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 2 and w.numel() > 0


def _linear_weight_bytes(*models: nn.Module) -> int:
    """Bytes of the fp32 CPU weights the autotune plans for (each weight counted once)."""
    seen = {id(m.weight): m.weight for model in models for m in model.modules()
            if _packable(m) and _fp32_cpu_2d(m.weight)}
    return sum(w.numel() * w.element_size() for w in seen.values())


def prepare_linear_weights(model: nn.Module, mode: str | None = None,
                           measure: Measure | None = None,
                           cache: TimingCache | None = None) -> int:
    """Give every packable layer of `model` its `linear_plan` and `packed_weight` (module
    docstring); `mode` defaults to the environment's (`linear_backend.mode_from_env`).
    Returns the packed copies' bytes, counted as their weights' bytes (cpu_gemm.py)."""
    mode = mode if mode is not None else lb.mode_from_env()
    layers = [m for m in model.modules() if _packable(m)]
    shapes = [_shape(m.weight) for m in layers if _fp32_cpu_2d(m.weight)]
    plans: dict[Shape, LinearPlan] = {}
    if shapes:
        lb.check_mode(mode)
        backends = lb.available_backends()
        if mode == "auto" and len(backends) > 1:
            nbytes = _linear_weight_bytes(model)
            if cache is None:
                cache = TimingCache(key=machine_key(weight_residency(nbytes)))
            if measure is None:
                measure = partial(measure_wall, stream_bytes=stream_footprint(nbytes))
            plans = tune_shapes(shapes, backends, cache, measure)
        elif mode == "auto":  # nothing to choose from: no packed backend on this build
            plans = {s: LinearPlan.uniform(s, "torch", "only torch") for s in dict.fromkeys(shapes)}
        else:
            plans = {s: LinearPlan.uniform(s, mode) for s in dict.fromkeys(shapes)}
    total = 0
    for m in layers:
        w = m.weight
        plan = plans.get(_shape(w)) if _fp32_cpu_2d(w) else None
        m.linear_plan = plan
        m.packed_weight = lb.pack(plan.packed, w) if plan is not None else None
        if m.packed_weight is not None:
            total += w.numel() * w.element_size()
    return total


def linear_backend_report(*models: nn.Module) -> dict[str, Any]:
    """What the layers of `models` run on: per weight shape the plan (`describe()`) and where
    it came from, the seconds spent measuring (0 when all came from the cache), the machine
    key and cache file. {"shapes": {}} when no layer has a plan (GPU, bf16, quantized)."""
    plans: dict[Shape, LinearPlan] = {}
    for model in models:
        for m in model.modules():
            plan = getattr(m, "linear_plan", None)
            if isinstance(plan, LinearPlan):
                plans.setdefault(plan.shape, plan)
    sources = sorted({p.source for p in plans.values()})
    return {
        "source": "+".join(sources) if sources else "none",
        "autotune_s": round(sum(p.tune_s for p in plans.values()), 3),
        "machine": machine_key(weight_residency(_linear_weight_bytes(*models)))
        if plans else None,
        "cache_file": str(default_cache_path()) if "forced" not in sources and plans else None,
        "shapes": {shape_key(s): f"{p.describe()} ({p.source})" for s, p in plans.items()},
    }
