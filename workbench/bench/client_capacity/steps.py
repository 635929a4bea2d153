"""One step of a client-capacity sweep and the climb: `StepResult` (one client at one rate),
its status, the `sweep` over the rates and the `Ceiling` found.

Place in the flow: `ours.run_ours` and `vllm.run_vllm` each
return a `StepResult` per rate; `sweep` calls one of them rate after rate (redoing disturbed
steps, stopping after late ones); `report` tabulates the steps and their
ceilings.

Status of a step: "ok"; "late" (the sends fell behind the schedule); "slow-read" (sent on
time, read late); "failed" (requests failed); "disturbed" (INVALID: other processes took more
than the allowed share of the CPUs; redone, never judged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workbench.bench.client_capacity.config import ClientCapacityConfig

STATUSES = ("ok", "late", "slow-read", "failed", "disturbed")
SEND_FAILURES = ("late", "failed")  # what the harness's validity (and --strict) judge
ALL_FAILURES = ("late", "slow-read", "failed")  # sends and reads must both keep up


class StepFailed(RuntimeError):
    """A client could not run a step at all (not a slow step: a broken one)."""


@dataclass
class StepResult:
    """One step of one client. Shares: client / mock CPU of one core; others' of all CPUs."""

    client: str  # "workbench" | "vllm"
    rate: float  # asked, req/s
    requests: int
    achieved_rate: float | None  # workbench: sends/s (validity); vllm: completed/s
    scheduled_rate: float | None  # workbench: the Poisson draw's own rate (validity)
    chunks_per_s: float  # received
    read_ratio: float | None  # workbench: received / offered chunks/s (see run_ours)
    median_lateness_ms: float | None  # workbench only
    p95_lateness_ms: float | None
    client_cpu: float | None
    server_cpu: float | None
    others_cpu: float | None  # None: not measured (window too short)
    failed: int
    status: str  # one of STATUSES
    read_lag_p50_ms: float | None = None  # workbench: its read loop's timer lag (loop_lag)
    read_lag_p95_ms: float | None = None
    reasons: list[str] = field(default_factory=list)
    attempts: int = 1

    @property
    def cpu_us_per_chunk(self) -> float | None:
        """The client's CPU-microseconds per chunk received (load-independent cost)."""
        if self.client_cpu is None or self.chunks_per_s <= 0:
            return None
        return self.client_cpu * 1e6 / self.chunks_per_s


def step_status(disturbed: bool, failed: int, kept_schedule: bool,
                kept_reading: bool = True) -> str:
    """Disturbed first (nothing else can be judged), then failed requests, the send
    schedule, the reading."""
    if disturbed:
        return "disturbed"
    if failed:
        return "failed"
    if not kept_schedule:
        return "late"
    return "ok" if kept_reading else "slow-read"


@dataclass(frozen=True)
class Ceiling:
    """`rate`: the highest judged rate below the first one whose status is a failure
    (`failed_at`); None when the lowest judged rate already failed or none was judged."""

    rate: float | None
    failed_at: float | None
    judged: int  # steps that were not disturbed

    def text(self) -> str:
        if self.judged == 0:
            return "no ceiling: every step was disturbed"
        if self.rate is None:
            return f"below {self.failed_at:g} req/s (the lowest judged rate fell behind)"
        if self.failed_at is None:
            return f">= {self.rate:g} req/s (no step fell behind: add higher --rates)"
        return f"{self.rate:g} req/s (the next judged step, {self.failed_at:g} req/s, fell behind)"


def find_ceiling(steps: Sequence[StepResult], failures: Sequence[str] = SEND_FAILURES
                 ) -> Ceiling:
    """Disturbed steps are skipped; `failures`: the statuses that end the climb."""
    judged = sorted((s for s in steps if s.status != "disturbed"), key=lambda s: s.rate)
    best: float | None = None
    for s in judged:
        if s.status in failures:
            return Ceiling(best, s.rate, len(judged))
        best = s.rate
    return Ceiling(best, None, len(judged))


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU-seconds of one process (0 when it is gone or None)."""
    import psutil

    if pid is None:
        return 0.0
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def sweep(config: ClientCapacityConfig, step: Callable[[float], StepResult],
          print_line: Callable[[str], None] | None = None
          ) -> tuple[list[StepResult], str | None]:
    """`step(rate) -> StepResult` over the rates; a disturbed step is redone up to
    `redo_disturbed` times; stops after `stop_after` steps in a row that were late or
    failed, or at a `StepFailed` (its message is returned with the steps before it)."""
    out: list[StepResult] = []
    behind = 0
    for rate in config.rates:
        for attempt in range(1, config.redo_disturbed + 2):
            try:
                result = step(rate)
            except StepFailed as e:
                return out, str(e)
            result.attempts = attempt
            if result.status != "disturbed":
                break
        out.append(result)
        if print_line is not None:
            lag = result.read_lag_p95_ms
            print_line(f"  {result.client} {rate:g} req/s: {status_text(result)}, "
                       f"{result.chunks_per_s:,.0f} chunks/s, client CPU "
                       f"{pct(result.client_cpu)}, others' {pct(result.others_cpu)}"
                       + ("" if lag is None else f", read-loop lag p95 {lag:.1f} ms"))
        behind = behind + 1 if result.status in SEND_FAILURES else (
            behind if result.status == "disturbed" else 0)
        if behind >= config.stop_after:
            break
    return out, None


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def status_text(s: StepResult) -> str:
    return "INVALID (disturbed)" if s.status == "disturbed" else s.status
