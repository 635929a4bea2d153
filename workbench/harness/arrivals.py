"""When each benchmark request is sent: the arrival process of a run, fixed by a seed.

The workload says *what* is sent; an `ArrivalSpec` says *when*. `arrival_offsets` turns it
into seconds from the run start, one per request (non-decreasing, the first at 0), so the
same spec always replays the same schedule. Modes:

    closed    C requests in flight at all times; the next one is sent when one finishes.
              No schedule (offsets are None): the server's speed sets the pace.
    poisson   open loop, exponential gaps with mean 1/rate.
    gamma     open loop, gamma gaps: shape = burstiness, scale = 1 / (rate * burstiness),
              so the mean rate is `rate` and the gaps' coefficient of variation is
              1/sqrt(burstiness): < 1 is burstier than Poisson, 1 is Poisson, > 1 is
              smoother, inf is constant (vLLM's `--burstiness`).
    constant  open loop, gaps of exactly 1/rate.
    trace     the workload's own `arrival_s` (a user JSONL), replayed as given.

`rate = inf` sends every request at t = 0. `max_concurrency` caps requests in flight for an
open loop (vLLM `--max-concurrency`); the runner enforces it, the schedule ignores it.

Differences from vLLM's `get_request`: the first request goes at t = 0 (vLLM also draws a gap
before it), the sampled gaps are not rescaled so the last offset is exactly N/rate, and the
ramp-up is defined in time, below, not by request index. The source of randomness is
`random.Random(seed)` (no numpy), drawn once per gap in request order.

Ramp-up over T = ramp_up_s seconds: the instantaneous rate grows linearly from 0 to `rate`
(`rate * t / T` for t < T, then `rate`). Equivalently, the unramped schedule s_k (same seed,
same gaps) is stretched by the inverse of the ramp's cumulative count
S(t) = t^2 / (2T) for t <= T, t - T/2 after:

    t_k = sqrt(2 T s_k)   if s_k <= T/2
    t_k = s_k + T/2       otherwise

so the first T seconds carry T/2 seconds' worth of full-rate requests and everything after
the ramp is the unramped schedule shifted by T/2. Example, constant rate 2/s, T = 4 s:
s = 0, .5, 1, 1.5, 2, 2.5 -> t = 0, 2, 2.828, 3.464, 4, 4.5. For Poisson this is exactly
an inhomogeneous Poisson process with the linear-ramp intensity.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from workbench.errors import is_int, is_real

MODES = ("closed", "poisson", "gamma", "constant", "trace")
OPEN_LOOP_MODES = ("poisson", "gamma", "constant", "trace")
_RATED = ("poisson", "gamma", "constant")
_INF_STRINGS = ("inf", "+inf", "infinity", "+infinity")


@dataclass(frozen=True)
class ArrivalSpec:
    """How requests arrive: a closed loop of `concurrency`, or an open-loop schedule."""

    mode: str  # "closed" | "poisson" | "gamma" | "constant" | "trace"
    concurrency: int | None = None  # closed loop: C requests in flight at all times
    rate: float | None = None  # open loop: requests/s (float("inf") = all at t = 0)
    burstiness: float = 1.0  # gamma shape (vLLM --burstiness; 1.0 == Poisson)
    max_concurrency: int | None = None  # optional cap on requests in flight, open loop
    ramp_up_s: float = 0.0  # the rate ramps linearly from 0 to `rate` over this many s
    seed: int = 0  # seeds the gaps of poisson/gamma

    def __post_init__(self) -> None:
        m = self.mode
        if m not in MODES:
            raise ValueError(f"ArrivalSpec mode ({m!r}) must be one of {list(MODES)}")
        if not is_int(self.seed):
            raise ValueError(f"ArrivalSpec seed ({self.seed!r}) must be an integer")
        if not is_real(self.burstiness) or self.burstiness <= 0:
            raise ValueError(
                f"ArrivalSpec burstiness ({self.burstiness!r}) must be > 0 "
                "(1.0 = Poisson, < 1 burstier, inf = constant gaps)"
            )
        if m != "gamma" and self.burstiness != 1.0:
            raise ValueError(
                f"ArrivalSpec burstiness ({self.burstiness}) only applies to mode 'gamma', "
                f"not {m!r}; use mode='gamma' or leave burstiness at 1.0"
            )
        if not is_real(self.ramp_up_s) or not 0 <= self.ramp_up_s < math.inf:
            raise ValueError(f"ArrivalSpec ramp_up_s ({self.ramp_up_s!r}) must be finite, >= 0")
        if m == "closed":
            self._check_closed()
        else:
            self._check_open()

    def _check_closed(self) -> None:
        c = self.concurrency
        if not is_int(c) or c < 1:
            raise ValueError(
                f"ArrivalSpec concurrency ({c!r}) must be an integer >= 1 for mode 'closed'"
            )
        for name in ("rate", "max_concurrency"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"ArrivalSpec {name} ({getattr(self, name)!r}) does not apply to mode "
                    "'closed' (concurrency sets the pace); leave it None or use an open loop"
                )
        if self.ramp_up_s != 0:
            raise ValueError(
                f"ArrivalSpec ramp_up_s ({self.ramp_up_s}) only applies to an open loop "
                "with a rate, not mode 'closed'"
            )

    def _check_open(self) -> None:
        m, r = self.mode, self.rate
        if self.concurrency is not None:
            raise ValueError(
                f"ArrivalSpec concurrency ({self.concurrency!r}) is for mode 'closed'; an "
                f"open loop ({m!r}) takes max_concurrency as its cap"
            )
        mc = self.max_concurrency
        if mc is not None and (not is_int(mc) or mc < 1):
            raise ValueError(f"ArrivalSpec max_concurrency ({mc!r}) must be None or >= 1")
        if m == "trace":
            if r is not None or self.ramp_up_s != 0:
                raise ValueError(
                    f"ArrivalSpec mode 'trace' replays the workload's arrival_s; rate ({r!r}) "
                    f"and ramp_up_s ({self.ramp_up_s}) must be left unset"
                )
            return
        if not is_real(r) or r <= 0:
            raise ValueError(
                f"ArrivalSpec rate ({r!r}) must be > 0 requests/s for mode {m!r} "
                "(float('inf') sends everything at t = 0)"
            )
        if self.ramp_up_s > 0 and math.isinf(r):
            raise ValueError(
                f"ArrivalSpec ramp_up_s ({self.ramp_up_s}) needs a finite rate, not {r}"
            )

    @property
    def is_open_loop(self) -> bool:
        """True when arrivals follow a schedule, not the completions (everything but closed)."""
        return self.mode in OPEN_LOOP_MODES

    def to_dict(self) -> dict[str, Any]:
        """All fields, JSON-safe: an infinite rate or burstiness is written as "inf"."""
        return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
                for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ArrivalSpec:
        """Reads `to_dict()` (and hand-written dicts: "inf" is accepted for rate/burstiness)."""
        if not isinstance(d, dict):
            raise ValueError(f"arrival spec ({d!r}) must be a dict with 'mode'")
        allowed = list(cls.__dataclass_fields__)
        unknown = sorted(set(d) - set(allowed))
        if unknown:
            raise ValueError(f"arrival spec has unknown keys {unknown}; allowed: {allowed}")
        if "mode" not in d:
            raise ValueError(f"arrival spec ({d!r}) needs 'mode', one of {list(MODES)}")
        kw = dict(d)
        for k in ("rate", "burstiness"):
            if isinstance(kw.get(k), str):
                if kw[k].strip().lower() not in _INF_STRINGS:
                    raise ValueError(f"arrival spec {k} ({kw[k]!r}) must be a number or 'inf'")
                kw[k] = math.inf
        return cls(**kw)


def ramp_warp(s: float, ramp_up_s: float) -> float:
    """The ramped time of unramped offset `s` (see the module docstring)."""
    t_ramp = ramp_up_s
    if t_ramp <= 0:
        return s
    if s <= t_ramp / 2:
        return math.sqrt(2.0 * t_ramp * s)
    return s + t_ramp / 2


def _trace_offsets(num_requests: int, trace: list[float | None] | None) -> list[float]:
    if trace is None:
        raise ValueError("mode 'trace' needs trace= (the workload's arrival_s, one per request)")
    if len(trace) != num_requests:
        raise ValueError(f"trace has {len(trace)} entries but num_requests is {num_requests}")
    out: list[float] = []
    for i, t in enumerate(trace):
        if t is None:
            raise ValueError(
                f"trace[{i}] is None: mode 'trace' needs every request to have arrival_s"
            )
        if not is_real(t) or not 0 <= t < math.inf:
            raise ValueError(f"trace[{i}] arrival_s ({t!r}) must be a finite number >= 0")
        if out and t < out[-1]:
            raise ValueError(
                f"trace[{i}] arrival_s ({t}) < trace[{i - 1}] ({out[-1]}): arrival_s must be "
                "non-decreasing in request order"
            )
        out.append(float(t))
    return out


def arrival_offsets(
    spec: ArrivalSpec, num_requests: int, trace: list[float | None] | None = None
) -> list[float] | None:
    """Seconds from the run start at which each request is sent, in request order
    (non-decreasing, the first at 0 except for a trace); None for a closed loop."""
    if not is_int(num_requests) or num_requests < 0:
        raise ValueError(f"num_requests ({num_requests!r}) must be an integer >= 0")
    if spec.mode == "closed":
        return None
    if spec.mode == "trace":
        return _trace_offsets(num_requests, trace)
    if spec.rate is None:  # ArrivalSpec refuses an open loop without one
        raise ValueError(f"ArrivalSpec mode {spec.mode!r} needs a rate")
    rate = float(spec.rate)
    if math.isinf(rate):
        return [0.0] * num_requests
    b = float(spec.burstiness)
    rng = random.Random(spec.seed)
    s, unramped = 0.0, [0.0] * min(num_requests, 1)
    for k in range(1, num_requests):
        if spec.mode == "constant":
            s = k / rate  # exact, no accumulated rounding
        elif math.isinf(b):
            s += 1.0 / rate
        else:  # poisson is gamma with shape 1
            s += rng.gammavariate(b, 1.0 / (rate * b))
        unramped.append(s)
    return [ramp_warp(x, spec.ramp_up_s) for x in unramped]
