"""The result of a client-capacity sweep: `ClientCapacity` (both clients' steps), its
ceilings, the side-by-side table, the summary lines and the JSON document.

Place in the flow: `client_capacity.measure` returns it; `client_capacity.main` prints
`table()` and `summary()` and writes `as_dict()` (`--json`). Two ceilings for ours: the
highest rate below the first late (or failed) step, the harness's own validity criterion,
and the highest below the first late, slow-read or failed one (sends and reads keep up),
the one to compare with vLLM's client.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from workbench.bench.client_capacity.config import ClientCapacityConfig
from workbench.bench.client_capacity.steps import (
    ALL_FAILURES,
    SEND_FAILURES,
    Ceiling,
    StepResult,
    find_ceiling,
    pct,
    status_text,
)
from workbench.harness.validity import (
    MAX_MEDIAN_LATENESS_S,
    MAX_P95_READ_LAG_S,
    MIN_RATE_FRACTION,
)

SERVER_BUSY = 0.9  # a mock above this share of its core may be what limited a step


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
                 "lateness p50 / p95 ms | ours: read-loop lag p50 / p95 ms | ours: client CPU "
                 "| ours: CPU µs / chunk | ours: mock / others' CPU | ours | vLLM: completed/s "
                 "| vLLM: chunks/s | vLLM: client CPU | vLLM: CPU µs / chunk | vLLM: mock / "
                 "others' CPU | vLLM | CPU per chunk, ours / vLLM |",
                 "|" + "---:|" * 8 + "---|" + "---:|" * 5 + "---|---:|"]
        ours = {s.rate: s for s in self.steps}
        theirs = {s.rate: s for s in self.vllm_steps}
        for rate in sorted(set(ours) | set(theirs)):
            o, v = ours.get(rate), theirs.get(rate)
            cells = [f"{rate:g}"] + (_our_cells(o) if o else ["-"] * 8)
            cells += [_num(v.achieved_rate), f"{v.chunks_per_s:,.0f}", pct(v.client_cpu),
                      _num(v.cpu_us_per_chunk), _shares(v), status_text(v)] if v else ["-"] * 6
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
                "max_p95_read_lag_ms": MAX_P95_READ_LAG_S * 1e3,
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
    late = _pair(s.median_lateness_ms, s.p95_lateness_ms)
    return [f"{_num(s.achieved_rate)} ({_num(s.scheduled_rate)})",
            f"{s.chunks_per_s:,.0f} ({pct(s.read_ratio)})", late,
            _pair(s.read_lag_p50_ms, s.read_lag_p95_ms), pct(s.client_cpu),
            _num(s.cpu_us_per_chunk), _shares(s), status_text(s)]


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.2f} / {b:.2f}"


def _shares(s: StepResult) -> str:
    return f"{pct(s.server_cpu)} / {pct(s.others_cpu)}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"
