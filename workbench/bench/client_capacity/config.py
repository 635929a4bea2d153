"""What one `workbench bench client-capacity` sweep measures: `ClientCapacityConfig`, the
rates, the request shape, the mock's pace, the climb's rules (validated on construction).

Place in the flow: `cli.main` builds it from the flags; every other module of this package
reads it (`ours` and `vllm` run one step of it, `steps.sweep` climbs its rates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from workbench.harness.validity import DEFAULT_MAX_OTHER_CPU_SHARE

DEFAULT_RATES = (50.0, 100.0, 200.0, 300.0, 400.0, 600.0, 800.0, 1200.0, 1600.0)
ARRIVALS = ("poisson", "constant")
MODEL = "mock"
DEFAULT_VLLM_VENV = Path(__file__).resolve().parents[3] / ".venv-vllm"


@dataclass(frozen=True)
class ClientCapacityConfig:
    rates: tuple[float, ...] = DEFAULT_RATES  # request rates to step through, req/s, rising
    duration_s: float = 4.0  # seconds of schedule per step (requests = rate x duration_s)
    input_len: int = 32  # prompt token ids per request
    output_len: int = 64  # tokens streamed per request (max_tokens, ignore_eos)
    arrival: str = "poisson"  # "poisson" | "constant" (a fixed rate)
    max_concurrency: int | None = None  # cap on requests in flight; None = none
    token_delay_s: float = 0.0  # the mock's delay between tokens
    stop_after: int = 1  # stop after this many steps in a row were late or failed
    redo_disturbed: int = 1  # redo a disturbed step up to this many times
    max_other_cpu_share: float = DEFAULT_MAX_OTHER_CPU_SHARE
    seed: int = 0
    pin: bool = True  # client and mock on separate cores (where there are >= 2)
    vllm: bool = True  # also run vLLM's client when its venv exists
    vllm_venv: Path = DEFAULT_VLLM_VENV

    def __post_init__(self) -> None:
        rates = tuple(self.rates)
        if not rates or any(isinstance(r, bool) or not isinstance(r, int | float)
                            or not 0 < r < math.inf for r in rates):
            raise ValueError(f"rates must be finite request rates > 0 (req/s), got {rates!r}")
        if list(rates) != sorted(set(rates)):
            raise ValueError(f"rates must rise strictly (the ceiling search steps up), got "
                             f"{rates!r}")
        object.__setattr__(self, "rates", tuple(float(r) for r in rates))
        if _not_number(self.duration_s) or not 0 < self.duration_s <= 600:
            raise ValueError(f"duration_s must be seconds in (0, 600], got {self.duration_s!r}")
        for name, low in (("input_len", 1), ("output_len", 1), ("stop_after", 1),
                          ("redo_disturbed", 0), ("seed", 0)):
            if _not_int(getattr(self, name), low):
                raise ValueError(f"{name} must be an integer >= {low}, got "
                                 f"{getattr(self, name)!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {list(ARRIVALS)}, got {self.arrival!r}")
        if self.max_concurrency is not None and _not_int(self.max_concurrency, 1):
            raise ValueError(f"max_concurrency must be an integer >= 1 or None, got "
                             f"{self.max_concurrency!r}")
        if _not_number(self.token_delay_s) or not 0 <= self.token_delay_s < 60:
            raise ValueError(f"token_delay_s must be seconds in [0, 60), got "
                             f"{self.token_delay_s!r}")
        if _not_number(self.max_other_cpu_share) or not 0 <= self.max_other_cpu_share <= 1:
            raise ValueError(f"max_other_cpu_share must be in [0, 1], got "
                             f"{self.max_other_cpu_share!r}")

    def num_requests(self, rate: float) -> int:
        return max(10, round(rate * self.duration_s))


def _not_int(value: object, low: int) -> bool:
    return isinstance(value, bool) or not isinstance(value, int) or value < low


def _not_number(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value)

