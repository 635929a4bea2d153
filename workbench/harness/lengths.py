"""Token-length distributions: the prompt and output lengths of a benchmark workload.

A workload records its traffic shape as data, so two runs can be shown to replay the same
lengths. `LengthDist` is that record: a kind (`fixed`, `uniform`, `lognormal`), its
parameters, and an inclusive clamp `[min, max]`. Sampling is seeded by the caller's
`random.Random`, so the same generator state always yields the same lengths.

The lognormal is given by what a report states, its median and 95th percentile:

    mu    = ln(p50)
    sigma = (ln(p95) - ln(p50)) / z_0.95        z_0.95 = 1.6448536...

A sample is `round(exp(mu + sigma * Z))`, then clamped. Clamping is monotone, so the stated
quantiles of the clamped distribution are the clamped quantiles (`describe()`).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

from workbench.errors import is_int

KINDS = ("fixed", "uniform", "lognormal")
Z95 = NormalDist().inv_cdf(0.95)  # 1.6448536269514722
_PARAMS = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("p50", "p95")}
_ALL_PARAMS = ("value", "low", "high", "p50", "p95")
_KEYS = ("kind", *_ALL_PARAMS, "min", "max")


def _is_num(x: Any) -> bool:
    return (is_int(x) or isinstance(x, float)) and math.isfinite(x)


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token lengths (ints >= 1), clamped to `[min, max]`."""

    kind: str  # "fixed" | "uniform" | "lognormal"
    value: int | None = None  # fixed: the one length
    low: int | None = None  # uniform: inclusive lower bound
    high: int | None = None  # uniform: inclusive upper bound
    p50: float | None = None  # lognormal: the median
    p95: float | None = None  # lognormal: the 95th percentile (> p50)
    min: int = 1  # clamp: no sample below this
    max: int | None = None  # clamp: no sample above this (None: unbounded)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"LengthDist kind ({self.kind!r}) must be one of {list(KINDS)}")
        need = _PARAMS[self.kind]
        for name in _ALL_PARAMS:
            got = getattr(self, name)
            if name in need and got is None:
                raise ValueError(
                    f"LengthDist(kind={self.kind!r}) needs {' and '.join(need)}; {name} is missing"
                )
            if name not in need and got is not None:
                raise ValueError(
                    f"LengthDist(kind={self.kind!r}) takes {' and '.join(need)}, not {name} "
                    f"({got!r})"
                )
        if not is_int(self.min) or self.min < 1:
            raise ValueError(f"LengthDist min ({self.min!r}) must be an integer >= 1")
        if self.max is not None and (not is_int(self.max) or self.max < self.min):
            raise ValueError(
                f"LengthDist max ({self.max!r}) must be None or an integer >= min ({self.min})"
            )
        top = math.inf if self.max is None else self.max
        if self.kind == "fixed":
            value = self._fixed()
            self._check_int("value", value)
            if not self.min <= value <= top:
                raise ValueError(
                    f"LengthDist value ({self.value}) lies outside [min, max] = "
                    f"[{self.min}, {self.max}]"
                )
        elif self.kind == "uniform":
            low, high = self._bounds()
            self._check_int("low", low)
            self._check_int("high", high)
            if high < low:
                raise ValueError(
                    f"LengthDist high ({self.high}) must be >= low ({self.low}) (inclusive range)"
                )
            if low > top or high < self.min:
                raise ValueError(
                    f"LengthDist [low, high] = [{self.low}, {self.high}] does not meet "
                    f"[min, max] = [{self.min}, {self.max}]"
                )
        else:
            for name in ("p50", "p95"):
                v = getattr(self, name)
                if not _is_num(v) or v < 1:
                    raise ValueError(f"LengthDist {name} ({v!r}) must be a finite number >= 1")
            p50, p95 = self._quantiles()
            if p95 <= p50:
                raise ValueError(
                    f"LengthDist p95 ({self.p95}) must be > p50 ({self.p50}); "
                    "use kind='fixed' for a constant length"
                )

    def _check_int(self, name: str, v: Any) -> None:
        if not is_int(v) or v < 1:
            raise ValueError(f"LengthDist {name} ({v!r}) must be an integer >= 1")

    # The parameters a kind needs, narrowed: __post_init__ refuses a missing one, so these
    # raise only if one was cleared afterwards (object.__setattr__ on the frozen fields).
    def _fixed(self) -> int:
        if self.value is None:
            raise self._missing()
        return self.value

    def _bounds(self) -> tuple[int, int]:
        if self.low is None or self.high is None:
            raise self._missing()
        return self.low, self.high

    def _quantiles(self) -> tuple[float, float]:
        if self.p50 is None or self.p95 is None:
            raise self._missing()
        return self.p50, self.p95

    def _missing(self) -> ValueError:
        need = " and ".join(_PARAMS[self.kind])
        return ValueError(f"LengthDist(kind={self.kind!r}) needs {need}; got {self!r}")

    @property
    def sigma(self) -> float:
        """The lognormal's log-space standard deviation (0 for other kinds)."""
        if self.kind != "lognormal":
            return 0.0
        p50, p95 = self._quantiles()
        return (math.log(p95) - math.log(p50)) / Z95

    def clamp(self, n: int) -> int:
        n = max(self.min, n)
        return n if self.max is None else min(self.max, n)

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """`n` lengths drawn from `rng` (one `rng` call per length for uniform/lognormal)."""
        if not is_int(n) or n < 0:
            raise ValueError(f"sample n ({n!r}) must be an integer >= 0")
        if self.kind == "fixed":
            return [self.clamp(self._fixed())] * n
        if self.kind == "uniform":
            low, high = self._bounds()
            return [self.clamp(rng.randint(low, high)) for _ in range(n)]
        mu, sigma = math.log(self._quantiles()[0]), self.sigma
        return [self.clamp(round(rng.lognormvariate(mu, sigma))) for _ in range(n)]

    def quantile(self, q: float) -> float:
        """The analytic q-quantile after clamping (uniform: the continuous approximation)."""
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile q ({q}) must be in (0, 1)")
        if self.kind == "fixed":
            x = float(self._fixed())
        elif self.kind == "uniform":
            low, high = self._bounds()
            x = low + q * (high - low)
        else:
            x = math.exp(math.log(self._quantiles()[0]) + self.sigma * NormalDist().inv_cdf(q))
        x = max(float(self.min), x)
        return x if self.max is None else min(float(self.max), x)

    def describe(self) -> dict[str, Any]:
        """For reports: the kind, the stated (analytic, clamped) p50 and p95, and the `dist`
        itself as `to_dict()` gives it."""
        return {
            "kind": self.kind,
            "p50": self.quantile(0.5),
            "p95": self.quantile(0.95),
            "dist": self.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        """The non-default fields as a JSON-serialisable dict (`from_dict` reads it back)."""
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None and not (k == "min" and v == 1)}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | int | LengthDist) -> LengthDist:
        """A dict of the fields (`kind` required), or an int meaning `fixed` at that value."""
        if isinstance(d, LengthDist):
            return d
        if is_int(d):
            return cls(kind="fixed", value=d)
        if not isinstance(d, dict):
            raise ValueError(
                f"length distribution ({d!r}) must be an int or a dict with 'kind' "
                f"(one of {list(KINDS)})"
            )
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ValueError(
                f"length distribution has unknown keys {unknown}; allowed: {list(_KEYS)}"
            )
        if "kind" not in d:
            raise ValueError(f"length distribution ({d!r}) needs 'kind', one of {list(KINDS)}")
        return cls(**d)
