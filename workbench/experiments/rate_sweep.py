"""The template's `rate_sweep` block: measure goodput per configuration instead of one run.

    rate_sweep:
      rates: [0.5, 1, 2, 4]          # requests/s, positive and increasing; Poisson arrivals
      slo: {ttft_ms: 500, tpot_ms: 100}
      attainment: 0.9                # optional, in (0, 1]; default 0.9
      num_workers: 2                 # optional, integer >= 1; goodput per worker; default 1

With it, every value of the variable (the baseline too) replays the same seeded workload at
each rate, `repeats` times; the objective is goodput (higher is better,
`workbench.harness.goodput`). With `max_repeats` above `repeats`, an undecided goodput gets
more rounds, each a whole sweep of the baseline and the undecided variant(s). Rules, checked
before anything runs:

- the sweep owns the arrival process: `arrivals` may only give `mode: poisson`, `seed` and
  `max_concurrency`; a `rate`, `concurrency`, another mode, `burstiness` or `ramp_up_s` is
  refused (not overridden). The seed is `arrivals.seed`, else `workload.seed`, else 0; with
  one seed the Poisson gaps of every rate are the same draws scaled by 1 / rate.
- `objective` may be left out or be `{metric: goodput | goodput_per_worker}` (direction
  maximize); the top-level `slo` (p95 bounds on one run) is refused: the per-request SLO of
  goodput is `rate_sweep.slo`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from workbench.errors import is_int
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.goodput import GoodputSLO

RATE_SWEEP_KEYS = ("rates", "slo", "attainment", "num_workers")
SLO_FIELDS = ("ttft_ms", "tpot_ms")
ARRIVAL_KEYS = ("mode", "seed", "max_concurrency")  # what a sweep's `arrivals` may give
OBJECTIVES = ("goodput", "goodput_per_worker")


def _positive(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and v > 0)


@dataclass(frozen=True)
class RateSweep:
    """A parsed `rate_sweep` block with the arrival settings it runs under."""

    rates: tuple[float, ...]  # requests/s, increasing
    slo: GoodputSLO  # per-request bounds and the attainment target
    num_workers: int = 1  # goodput_per_worker = goodput / num_workers
    seed: int = 0  # the Poisson arrivals' seed
    max_concurrency: int | None = None  # optional cap on requests in flight

    def __post_init__(self) -> None:
        problems = _rates_problems(list(self.rates))
        if problems:
            raise ValueError(problems[0])
        if not is_int(self.num_workers) or self.num_workers < 1:
            raise ValueError(f"rate_sweep.num_workers ({self.num_workers!r}) must be an "
                             "integer >= 1")

    def arrival(self, rate: float) -> ArrivalSpec:
        """The harness's Poisson arrival process at `rate` with the sweep's seed."""
        return ArrivalSpec.from_dict(self.arrivals(rate))

    def arrivals(self, rate: float) -> dict[str, Any]:
        """The arrivals block of one sweep point (logged as its params)."""
        d: dict[str, Any] = {"mode": "poisson", "rate": rate, "seed": self.seed}
        if self.max_concurrency is not None:
            d["max_concurrency"] = self.max_concurrency
        return d

    def to_dict(self) -> dict[str, Any]:
        """The block as a template writes it."""
        return {"rates": list(self.rates),
                "slo": {"ttft_ms": self.slo.ttft_ms, "tpot_ms": self.slo.tpot_ms},
                "attainment": self.slo.attainment, "num_workers": self.num_workers}


def _rates_problems(rates: Any) -> list[str]:
    if not isinstance(rates, list | tuple) or not rates:
        return [f"rate_sweep.rates ({rates!r}) must be a non-empty list of requests/s, "
                "e.g. [0.5, 1, 2, 4]"]
    bad = [r for r in rates if not _positive(r)]
    if bad:
        return [f"rate_sweep.rates ({list(rates)!r}) must be positive finite numbers "
                f"(requests/s); {bad[0]!r} is not"]
    if any(b <= a for a, b in zip(rates, rates[1:], strict=False)):
        return [f"rate_sweep.rates ({list(rates)!r}) must be strictly increasing"]
    return []


def _block_problems(block: Any) -> list[str]:
    if not isinstance(block, dict):
        return [f"rate_sweep must be a mapping {{rates: [...], slo: {{ttft_ms, tpot_ms}}}}, "
                f"not {block!r}"]
    out = [f"unknown rate_sweep key {k!r}; allowed: {', '.join(RATE_SWEEP_KEYS)}"
           for k in sorted(set(block) - set(RATE_SWEEP_KEYS), key=str)]
    out += [f"rate_sweep is missing {k!r}" for k in ("rates", "slo") if k not in block]
    if "rates" in block:
        out += _rates_problems(block["rates"])
    slo = block.get("slo", {})
    if not isinstance(slo, dict):
        out.append(f"rate_sweep.slo ({slo!r}) must be {{ttft_ms: N, tpot_ms: N}}")
    else:
        out += [f"unknown rate_sweep.slo key {k!r}; allowed: {', '.join(SLO_FIELDS)}"
                for k in sorted(set(slo) - set(SLO_FIELDS), key=str)]
        for k in SLO_FIELDS:
            if "slo" in block and k not in slo:
                out.append(f"rate_sweep.slo is missing {k!r} (ms)")
            elif k in slo and not _positive(slo[k]):
                out.append(f"rate_sweep.slo.{k} ({slo[k]!r}) must be a number > 0 ms")
    a = block.get("attainment", 0.9)
    if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a <= 1:
        out.append(f"rate_sweep.attainment ({a!r}) must be a share in (0, 1], e.g. 0.9")
    w = block.get("num_workers", 1)
    if not is_int(w) or w < 1:
        out.append(f"rate_sweep.num_workers ({w!r}) must be an integer >= 1")
    return out


def _conflicts(data: dict[str, Any]) -> list[str]:
    """What the rest of the template may not say beside a rate sweep."""
    out = []
    arrivals = data.get("arrivals") or {}
    if not isinstance(arrivals, dict):
        return [f"arrivals must be a mapping, not {arrivals!r}"]
    for k in sorted(set(arrivals) - set(ARRIVAL_KEYS), key=str):
        out.append(f"arrivals.{k} ({arrivals[k]!r}) conflicts with rate_sweep: the sweep sets "
                   f"the Poisson rate per point; arrivals may only give "
                   f"{', '.join(ARRIVAL_KEYS)}")
    if arrivals.get("mode", "poisson") != "poisson":
        out.append(f"arrivals.mode ({arrivals['mode']!r}) conflicts with rate_sweep: a sweep "
                   "runs Poisson arrivals; drop arrivals.mode or set it to poisson")
    seed = arrivals.get("seed", 0)
    if not is_int(seed):
        out.append(f"arrivals.seed ({seed!r}) must be an integer")
    mc = arrivals.get("max_concurrency")
    if mc is not None and (not is_int(mc) or mc < 1):
        out.append(f"arrivals.max_concurrency ({mc!r}) must be an integer >= 1 or absent")
    objective = data.get("objective") or {}
    if isinstance(objective, dict):
        out += [f"unknown objective key {k!r}; allowed: metric, direction"
                for k in sorted(set(objective) - {"metric", "direction"}, key=str)]
        metric = objective.get("metric", "goodput")
        if metric not in OBJECTIVES:
            out.append(f"objective.metric ({metric!r}) conflicts with rate_sweep: a sweep's "
                       f"objective is one of {', '.join(OBJECTIVES)} (or leave it out)")
        if objective.get("direction", "maximize") != "maximize":
            out.append(f"objective.direction ({objective['direction']!r}) must be maximize "
                       "for goodput (or leave it out)")
    if data.get("slo"):
        out.append(f"slo ({data['slo']!r}) conflicts with rate_sweep: the per-request SLO of "
                   "goodput is rate_sweep.slo; drop the top-level slo")
    return out


def rate_sweep_problems(data: dict[str, Any]) -> list[str]:
    """Every problem of a raw template's `rate_sweep` block and its conflicts ([] without
    the block)."""
    if "rate_sweep" not in data:
        return []
    return _block_problems(data["rate_sweep"]) + _conflicts(data)


def parse_rate_sweep(data: dict[str, Any]) -> RateSweep | None:
    """The raw template's sweep (None without a `rate_sweep` block); ValueError listing
    every problem in one line otherwise."""
    problems = rate_sweep_problems(data)
    if problems:
        raise ValueError("; ".join(problems))
    if "rate_sweep" not in data:
        return None
    block = data["rate_sweep"]
    arrivals: dict[str, Any] = data.get("arrivals") or {}  # a mapping: checked by _conflicts
    workload = data.get("workload") or {}
    workload_seed = workload.get("seed", 0) if isinstance(workload, dict) else 0
    seed = arrivals["seed"] if "seed" in arrivals else workload_seed
    return RateSweep(
        rates=tuple(float(r) for r in block["rates"]),
        slo=GoodputSLO(float(block["slo"]["ttft_ms"]), float(block["slo"]["tpot_ms"]),
                       float(block.get("attainment", 0.9))),
        num_workers=int(block.get("num_workers", 1)), seed=int(seed),
        max_concurrency=arrivals.get("max_concurrency"))
