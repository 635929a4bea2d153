"""Validity of one measured run: did the client send the traffic it was asked to, and did
the machine stay quiet while it ran?

Place in the flow: the runner measures inside `CpuWatch.measure()` and calls `check_validity`
after a run; an invalid run stays in the results, marked, with one sentence per reason (the
runner also warns loudly). Every other measuring tool (the offline and spec benches, each
experiment run, each sweep point) uses the same `CpuWatch` and `Validity.judge_cpu`.

Open loop only (a closed loop sends whenever a worker is free, so it cannot fall behind):
- target rate: the rate the schedule asked for, (n - 1) / span of the scheduled offsets
  (equal to `arrival.rate` for "constant"; for Poisson/gamma the rate of the actual draw, so a
  short run is not flagged for the draw's randomness);
- achieved rate: (n - 1) / (last actual send - first scheduled offset) over requests sent;
- invalid when achieved < 95% of target, or median lateness (send - scheduled) > the threshold
  (MAX_MEDIAN_LATENESS_S, 50 ms); `lateness_table` shows both in a run's report.

Reading, open or closed loop, for a target that reads on its own event loop (HTTP): lateness
sees a late sender only; a client whose reading falls behind sends on time while its delay
inflates every TTFT and ITL. `loop_lag` times a timer on the read loop over the run (p50 /
p95 / max of how late it woke, and this process's CPU share); invalid when the p95 exceeds
MAX_P95_READ_LAG_S (`read_lag_reason`, also `workbench bench client-capacity`'s
"slow-read"). Recorded but not judged when the CPU share is stated (below): the suite's runs.

Disturbance, every run: `CpuWatch` measures the share of the machine's CPUs that OTHER
processes kept busy meanwhile: (system-wide busy CPU-seconds - CPU-seconds of this process
tree and of the system under test's processes) / (wall seconds x CPUs). Above
`max_other_cpu_share` (default DEFAULT_MAX_OTHER_CPU_SHARE of the machine) the run is invalid:
its timings measured the neighbours as much as the engine. Windows shorter than
MIN_WATCH_WALL_S are not judged (the kernel counts CPU time in 10 ms ticks). Tests inject
`FixedCpuWatch`; WORKBENCH_OTHER_CPU_SHARE=<share> states the share instead of measuring it
(the test suite sets 0 so results never depend on the machine's load).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from workbench.harness.loop_lag import MIN_LAG_SAMPLES, ReadLag

if TYPE_CHECKING:  # types only: importing metrics would pull pandas into every user
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.metrics import RequestRecord

MIN_RATE_FRACTION = 0.95
MAX_MEDIAN_LATENESS_S = 0.05  # an open-loop run whose median lateness exceeds this is invalid
MAX_P95_READ_LAG_S = 0.02  # a run whose client read loop's p95 lag exceeds this is invalid
DEFAULT_MAX_OTHER_CPU_SHARE = 0.25  # of all the machine's CPUs
MIN_WATCH_WALL_S = 0.25  # shorter windows are not judged (10 ms ticks)
STATED_SHARE_ENV = "WORKBENCH_OTHER_CPU_SHARE"
MAX_READ_LAG_ENV = "WORKBENCH_MAX_READ_LAG_S"  # seconds, or "off" (recorded, not judged)
logger = logging.getLogger(__name__)


@dataclass
class Validity:
    """valid is False when any reason was found; rates in requests/s, lateness in seconds."""

    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    target_rate: float | None = None
    achieved_rate: float | None = None
    median_lateness_s: float | None = None
    p95_lateness_s: float | None = None
    other_cpu_share: float | None = None  # of all CPUs, by other processes; None: not measured
    max_other_cpu_share: float | None = None  # the threshold it was judged by; None: not judged
    # the client's read loop (loop_lag; HTTP targets): timer lag, None where not watched
    read_lag_samples: int | None = None
    read_lag_p50_s: float | None = None
    read_lag_p95_s: float | None = None
    read_lag_max_s: float | None = None
    client_cpu_share: float | None = None  # this process's CPU-s per wall s (1.0 = one core)
    max_read_lag_s: float | None = None  # the p95 threshold it was judged by; None: not judged

    def invalidate(self, reason: str) -> None:
        self.valid = False
        self.reasons.append(reason)

    def judge_cpu(self, share: float, threshold: float | None) -> None:
        """Record the other processes' CPU share; invalid above `threshold` (None: record
        only). A NaN share (not measurable) is recorded as None and never judged."""
        if threshold is not None and not 0 <= threshold <= 1:
            raise ValueError(f"max_other_cpu_share ({threshold}) must be in [0, 1]")
        self.other_cpu_share = None if math.isnan(share) else share
        self.max_other_cpu_share = threshold
        if threshold is not None and self.disturbed:
            self.invalidate(cpu_reason(share, threshold))

    @property
    def disturbed(self) -> bool:
        """Other processes took more of the CPUs than the threshold allows."""
        return (self.other_cpu_share is not None and self.max_other_cpu_share is not None
                and self.other_cpu_share > self.max_other_cpu_share)

    def judge_read_lag(self, lag: ReadLag | None, threshold_s: float | None) -> None:
        """Record the client's read-loop lag (None: not watched, nothing recorded); invalid
        when its p95 exceeds `threshold_s` (None: record only) over enough samples."""
        if threshold_s is not None and not threshold_s > 0:
            raise ValueError(f"max_read_lag_s ({threshold_s}) must be > 0 seconds or None")
        if lag is None:
            return
        self.read_lag_samples, self.read_lag_p50_s = lag.samples, lag.p50_s
        self.read_lag_p95_s, self.read_lag_max_s = lag.p95_s, lag.max_s
        self.client_cpu_share, self.max_read_lag_s = lag.cpu_share, threshold_s
        if (reason := read_lag_reason(lag, threshold_s)) is not None:
            self.invalidate(reason)

    def read_lag(self) -> ReadLag | None:
        """The read lag `judge_read_lag` recorded; None when the run was not watched."""
        if self.read_lag_samples is None:
            return None
        return ReadLag(self.read_lag_samples, self.read_lag_p50_s, self.read_lag_p95_s,
                       self.read_lag_max_s, self.client_cpu_share)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_validity(
    records: Sequence[RequestRecord],
    arrival: ArrivalSpec,
    duration_s: float,
    max_median_lateness_s: float = MAX_MEDIAN_LATENESS_S,
) -> Validity:
    """Judge whether an open-loop run kept its schedule (a closed loop is always valid here).

    Records without a target_arrival_s (never scheduled) are ignored. duration_s (the run's
    wall time) is accepted for symmetry with `compute_metrics`; the criteria use the schedule.
    """
    if max_median_lateness_s < 0:
        raise ValueError(f"max_median_lateness_s ({max_median_lateness_s}) must be >= 0")
    out = Validity()
    if not arrival.is_open_loop:
        return out
    sent = [r for r in records if r.target_arrival_s is not None]
    if not sent:
        return out
    targets = np.array([r.target_arrival_s for r in sent], dtype=float)
    starts = np.array([r.start_s for r in sent], dtype=float)
    lateness = starts - targets
    out.median_lateness_s = float(np.median(lateness))
    out.p95_lateness_s = float(np.percentile(lateness, 95))
    n = len(sent)
    target_span = float(targets.max() - targets.min())
    sent_span = float(starts.max() - targets.min())
    if n >= 2 and target_span > 0 and sent_span > 0:
        out.target_rate = (n - 1) / target_span
        out.achieved_rate = (n - 1) / sent_span
        if out.achieved_rate < MIN_RATE_FRACTION * out.target_rate:
            out.invalidate(
                f"achieved send rate {out.achieved_rate:.3g} req/s is below "
                f"{MIN_RATE_FRACTION:.0%} of the target {out.target_rate:.3g} req/s: the client "
                "fell behind the arrival schedule (raise max_concurrency or lower the rate)"
            )
    if out.median_lateness_s > max_median_lateness_s:
        out.invalidate(
            f"median lateness {out.median_lateness_s * 1e3:.1f} ms (p95 "
            f"{out.p95_lateness_s * 1e3:.1f} ms) exceeds {max_median_lateness_s * 1e3:.1f} ms: "
            "requests were sent later than scheduled (a concurrency cap or a busy client)"
        )
    return out


def lateness_table(v: Validity, threshold_s: float = MAX_MEDIAN_LATENESS_S) -> str | None:
    """The client's schedule keeping (an open-loop run) and read-loop lag (an HTTP target)
    as a Markdown table for the run's report; None when neither was measured."""
    rows = []
    if v.median_lateness_s is not None and v.p95_lateness_s is not None:
        rows += [f"| Median lateness, send - scheduled (ms) | {v.median_lateness_s * 1e3:.2f} |",
                 f"| P95 lateness (ms) | {v.p95_lateness_s * 1e3:.2f} |"]
        if v.achieved_rate is not None and v.target_rate is not None:
            rows.append(f"| Send rate achieved / scheduled (req/s) | {v.achieved_rate:.2f} / "
                        f"{v.target_rate:.2f} |")
        rows.append(f"| Invalid above a median lateness of (ms) | {threshold_s * 1e3:.1f} |")
    p50, p95, top = v.read_lag_p50_s, v.read_lag_p95_s, v.read_lag_max_s
    if p50 is not None and p95 is not None and top is not None:
        cells = " / ".join(f"{x * 1e3:.2f}" for x in (p50, p95, top))
        rows.append(f"| Read-loop lag p50 / p95 / max (ms) | {cells} |")
        if v.client_cpu_share is not None:
            rows.append(f"| Client process CPU (share of one core) | {v.client_cpu_share:.0%} |")
        if v.max_read_lag_s is not None:
            rows.append(f"| Invalid above a p95 read-loop lag of (ms) | "
                        f"{v.max_read_lag_s * 1e3:.1f} |")
    if not rows:
        return None
    head = "Client schedule (open loop)" if v.median_lateness_s is not None else "Client"
    return "\n".join([f"| {head} | |", "|---|---:|", *rows])


def read_lag_reason(lag: ReadLag, threshold_s: float | None) -> str | None:
    """The sentence a run whose client fell behind reading carries: its read loop's p95
    lag above `threshold_s`. None when it kept up, when there were fewer than
    MIN_LAG_SAMPLES samples, or when not judged (threshold None). The runner's validity
    and `workbench bench client-capacity`'s "slow-read" both judge with this."""
    p95 = lag.p95_s
    if threshold_s is None or p95 is None or lag.samples < MIN_LAG_SAMPLES:
        return None
    if p95 <= threshold_s:
        return None
    cpu = "" if lag.cpu_share is None else (
        f"; the client process used {lag.cpu_share:.0%} of a core")
    return (f"the client's read loop woke {p95 * 1e3:.1f} ms late at p95 (median "
            f"{(lag.p50_s or 0) * 1e3:.1f} ms, max {(lag.max_s or 0) * 1e3:.1f} ms{cpu}), above "
            f"{threshold_s * 1e3:.1f} ms: it fell behind reading the streams, so TTFT and ITL "
            "include its own delay (lower the rate or give the client a core of its own)")


def default_max_read_lag_s() -> float | None:
    """The read-lag threshold a run is judged by: $WORKBENCH_MAX_READ_LAG_S (seconds, or "off":
    record the lag, do not judge it, as the test suite sets: like the other processes' CPU
    share, the lag depends on the machine's load, and no test result may), else
    MAX_P95_READ_LAG_S. ValueError names a bad value."""
    raw = os.environ.get(MAX_READ_LAG_ENV, "").strip()
    if not raw:
        return MAX_P95_READ_LAG_S
    if raw.lower() == "off":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{MAX_READ_LAG_ENV} ({raw!r}) must be a number of seconds > 0 or off")
    return value


# --------------------------------------------------------------------------- CPU disturbance
def cpu_reason(share: float, threshold: float) -> str:
    """The one sentence an invalid (disturbed) run carries."""
    return (f"other processes used {share:.0%} of the CPUs during the run (threshold "
            f"{threshold:.0%}): its timings are disturbed; rerun on a quieter machine")


def disturbed_line(run: str, share: float, threshold: float) -> str:
    """The console line naming the run, the share and the threshold."""
    return (f"INVALID {run}: other processes used {share:.0%} of the CPUs "
            f"(threshold {threshold:.0%}); not used for any result")


@dataclass
class CpuShare:
    """Filled when a `CpuWatch.measure()` block ends: `others` is the share of all CPUs
    other processes kept busy (0 = quiet; 0.5 = one of 2 cores taken); NaN = not measured."""

    others: float = float("nan")
    wall_s: float = 0.0


@dataclass(frozen=True)
class CpuSample:
    """Cumulative counters at one instant: wall clock, busy CPU-seconds of the whole
    machine, CPU-seconds of the watched process trees."""

    wall_s: float
    busy_s: float
    own_s: float


def busy_cpu_s() -> float:
    """CPU-seconds the whole machine spent busy (user, nice, system, irq, softirq, steal)."""
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq",
                                             "steal"))


def tree_cpu_s(roots: Sequence[int]) -> float:
    """CPU-seconds of each root process and all its descendants, each counted once, with
    the children they have already reaped (a finished subprocess stays counted)."""
    import psutil

    seen: dict[int, float] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            try:
                t = p.cpu_times()
            except psutil.Error:  # it ended meanwhile; its parent counts it once reaped
                continue
            seen[p.pid] = t.user + t.system + t.children_user + t.children_system
    return sum(seen.values())


def read_cpu_sample(roots: Sequence[int]) -> CpuSample:
    return CpuSample(time.perf_counter(), busy_cpu_s(), tree_cpu_s(roots))


class CpuWatch:
    """How much of the machine other processes took while a block ran:

        with watch.measure(extra_pids) as share:
            ... the measured run ...
        share.others   # fraction of all CPUs; NaN when not measurable

    "Other" excludes this process and its descendants (in-process engine, TP workers, a
    server it started, a notebook kernel) and the process trees of `extra_pids` (an
    external server on this machine). `read` and `cpus` are injectable for exact tests."""

    def __init__(self, read: Callable[[Sequence[int]], CpuSample] = read_cpu_sample,
                 cpus: int | None = None, min_wall_s: float = MIN_WATCH_WALL_S) -> None:
        self.read, self.min_wall_s = read, min_wall_s
        self.cpus = cpus or os.cpu_count() or 1

    @contextmanager
    def measure(self, extra_pids: Sequence[int] = ()) -> Iterator[CpuShare]:
        roots = list(dict.fromkeys([os.getpid(), *extra_pids]))
        share = CpuShare()
        try:
            start: CpuSample | None = self.read(roots)
        except (OSError, ImportError):
            start = None
        try:
            yield share
        finally:
            if start is not None:
                try:
                    end: CpuSample | None = self.read(roots)
                except (OSError, ImportError):
                    end = None
                if end is not None:
                    share.wall_s = end.wall_s - start.wall_s
                    share.others = self._share(start, end)

    def _share(self, start: CpuSample, end: CpuSample) -> float:
        wall = end.wall_s - start.wall_s
        if wall < self.min_wall_s:
            return float("nan")
        other = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
        return min(1.0, max(0.0, other / (wall * self.cpus)))


class FixedCpuWatch(CpuWatch):
    """A watch that reports given shares instead of measuring: one per `measure()` call,
    the last repeated (tests; WORKBENCH_OTHER_CPU_SHARE)."""

    def __init__(self, *shares: float) -> None:
        super().__init__()
        self.shares = list(shares) or [0.0]
        self.calls = 0

    @contextmanager
    def measure(self, extra_pids: Sequence[int] = ()) -> Iterator[CpuShare]:
        value = self.shares[min(self.calls, len(self.shares) - 1)]
        self.calls += 1
        share = CpuShare()
        try:
            yield share
        finally:
            share.others = value


def default_cpu_watch() -> CpuWatch:
    """The real watch, or a FixedCpuWatch when WORKBENCH_OTHER_CPU_SHARE states the share."""
    stated = os.environ.get(STATED_SHARE_ENV)
    if stated is None or stated == "":
        return CpuWatch()
    try:
        value = float(stated)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise ValueError(f"{STATED_SHARE_ENV} ({stated!r}) must be a share in [0, 1]")
    if "PYTEST_CURRENT_TEST" not in os.environ:  # the suite states it on purpose
        logger.warning("%s=%s: the other processes' CPU share is stated, not measured; "
                       "unset it for real measurements", STATED_SHARE_ENV, stated)
    return FixedCpuWatch(value)


LOAD_CHECK_S = 1.0  # how long `load_before_start` watches the machine


def load_before_start(watch: CpuWatch, window_s: float = LOAD_CHECK_S,
                      wait: Callable[[float], None] = time.sleep) -> float:
    """The share of all CPUs other processes take now, watched for `window_s` before a
    measured series starts (NaN: not measurable). A `FixedCpuWatch` (a stated share, tests)
    answers at once."""
    with watch.measure() as share:
        if not isinstance(watch, FixedCpuWatch):
            wait(window_s)
    return share.others


def busy_machine_line(share: float, threshold: float, flag: str = "--max-other-cpu-share"
                      ) -> str | None:
    """The warning before a series starts when other processes already take more than
    `threshold` of the CPUs; None when the machine is quiet enough (or not measured)."""
    if math.isnan(share) or share <= threshold:
        return None
    return (f"other processes already use {share:.0%} of the CPUs (threshold "
            f"{threshold:.0%}): runs measured now will likely be INVALID; wait for a "
            f"quieter machine, or raise {flag}")


def invalid_advice(invalid: int, total: int, flag: str = "--max-other-cpu-share"
                   ) -> str | None:
    """The closing line when runs came back INVALID ("3/3 invalid: rerun on a quieter
    machine, or raise --max-other-cpu-share"); None when none did."""
    if invalid <= 0:
        return None
    return f"{invalid}/{total} invalid: rerun on a quieter machine, or raise {flag}"


def local_server_pids(base_url: str) -> list[int] | None:
    """The processes listening on `base_url`'s port when its host is this machine (their
    CPU use is the system under test, not a disturbance); [] for a remote host; None when
    the host is local but no visible process listens there (another user's, a container)."""
    parts = urlsplit(base_url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        local = host in ("localhost", "0.0.0.0", "::", socket.gethostname()) or \
            ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        local = False
    if not local:
        return []
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    pids = sorted({c.pid for c in conns if c.pid and c.status == psutil.CONN_LISTEN
                   and c.laddr and c.laddr.port == port})
    return pids or None
