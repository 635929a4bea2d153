"""The CPU watch and the disturbance rule (issue 15, part 4): exact arithmetic on scripted
readings, injected fakes for every measured run; nothing here depends on the machine's load."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from tests.harness.fakes import QuietTarget
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import RequestRecord
from workbench.harness.replay import run
from workbench.harness.validity import (
    DEFAULT_MAX_OTHER_CPU_SHARE,
    STATED_SHARE_ENV,
    CpuSample,
    CpuWatch,
    FixedCpuWatch,
    Validity,
    cpu_reason,
    default_cpu_watch,
    disturbed_line,
    local_server_pids,
    tree_cpu_s,
)
from workbench.harness.workloads import BenchRequest, Workload


def scripted(*samples: CpuSample) -> tuple[list[list[int]], Any]:
    """A reader returning `samples` in order, and the roots it was asked about."""
    asked: list[list[int]] = []
    it = iter(samples)

    def read(roots: Sequence[int]) -> CpuSample:
        asked.append(list(roots))
        return next(it)

    return asked, read


def test_share_is_others_busy_time_over_wall_time_and_cpus() -> None:
    # 2 CPUs for 2 s = 4 CPU-s; the machine was busy 3 CPU-s, 1 of them ours -> 2 / 4.
    asked, read = scripted(CpuSample(10.0, 100.0, 5.0), CpuSample(12.0, 103.0, 6.0))
    watch = CpuWatch(read=read, cpus=2)
    with watch.measure([4242, os.getpid()]) as share:
        assert share.others != share.others  # NaN until the block ends
    assert share.others == 0.5 and share.wall_s == 2.0
    assert asked == [[os.getpid(), 4242]] * 2  # this process first, each root once


@pytest.mark.parametrize(("busy", "own", "want"), [
    (0.5, 1.0, 0.0),  # own time counted in ticks can exceed the busy delta: never negative
    (10.0, 0.0, 1.0),  # clamped to the whole machine
    (1.0, 0.0, 0.25),
])
def test_share_is_clamped_to_the_machine(busy: float, own: float, want: float) -> None:
    _, read = scripted(CpuSample(0.0, 0.0, 0.0), CpuSample(2.0, busy, own))
    with CpuWatch(read=read, cpus=2).measure() as share:
        pass
    assert share.others == want


def test_short_or_unreadable_windows_are_not_measured() -> None:
    _, read = scripted(CpuSample(0.0, 0.0, 0.0), CpuSample(0.1, 0.2, 0.0))
    with CpuWatch(read=read, cpus=2, min_wall_s=0.25).measure() as share:
        pass
    assert share.others != share.others and share.wall_s == 0.1  # NaN: 10 ms ticks

    def broken(roots: Sequence[int]) -> CpuSample:
        raise OSError("no /proc here")

    with CpuWatch(read=broken).measure() as share:
        pass
    assert share.others != share.others


def test_share_is_filled_when_the_block_raises() -> None:
    _, read = scripted(CpuSample(0.0, 0.0, 0.0), CpuSample(1.0, 1.0, 0.0))
    with pytest.raises(RuntimeError), CpuWatch(read=read, cpus=1).measure() as share:
        raise RuntimeError("the notebook failed")
    assert share.others == 1.0


def test_fixed_watch_reports_its_shares_in_order_then_repeats_the_last() -> None:
    watch = FixedCpuWatch(0.0, 0.6)
    got = []
    for _ in range(3):
        with watch.measure() as share:
            pass
        got.append(share.others)
    assert got == [0.0, 0.6, 0.6] and watch.calls == 3


def test_default_watch_is_stated_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STATED_SHARE_ENV, "0.4")
    watch = default_cpu_watch()
    assert isinstance(watch, FixedCpuWatch) and watch.shares == [0.4]
    monkeypatch.setenv(STATED_SHARE_ENV, "lots")
    with pytest.raises(ValueError, match=r"WORKBENCH_OTHER_CPU_SHARE \('lots'\) must be"):
        default_cpu_watch()
    monkeypatch.delenv(STATED_SHARE_ENV)
    assert type(default_cpu_watch()) is CpuWatch


def test_judge_cpu_invalidates_only_above_the_threshold() -> None:
    v = Validity()
    v.judge_cpu(0.25, 0.25)
    assert v.valid and not v.disturbed and v.other_cpu_share == 0.25
    v = Validity()
    v.judge_cpu(0.41, 0.25)
    assert not v.valid and v.disturbed and v.max_other_cpu_share == 0.25
    assert v.reasons == ["other processes used 41% of the CPUs during the run (threshold 25%): "
                         "its timings are disturbed; rerun on a quieter machine"]
    assert v.reasons == [cpu_reason(0.41, 0.25)]
    v = Validity()
    v.judge_cpu(float("nan"), 0.25)
    assert v.valid and v.other_cpu_share is None
    v = Validity()
    v.judge_cpu(0.9, None)  # recorded, not judged
    assert v.valid and v.other_cpu_share == 0.9 and not v.disturbed
    with pytest.raises(ValueError, match=r"max_other_cpu_share \(1.5\) must be in \[0, 1\]"):
        Validity().judge_cpu(0.1, 1.5)
    assert disturbed_line("run x=1 repeat 2/3", 0.41, 0.25) == (
        "INVALID run x=1 repeat 2/3: other processes used 41% of the CPUs (threshold 25%); "
        "not used for any result")


def test_tree_cpu_counts_a_finished_child() -> None:
    """A child's CPU time is ours once it is reaped (a papermill kernel, a TP worker)."""
    before = tree_cpu_s([os.getpid()])
    burn = "import time\nwhile time.process_time() < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert tree_cpu_s([os.getpid()]) - before >= 0.3 - 0.03  # the kernel counts 10 ms ticks
    assert tree_cpu_s([2**22 + 12345]) == 0.0  # no such process


def test_local_server_pids() -> None:
    assert local_server_pids("http://192.0.2.1:8000/v1") == []  # another machine
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert local_server_pids(f"http://127.0.0.1:{port}/v1") == [os.getpid()]
    assert local_server_pids(f"http://localhost:{port}/v1") is None  # nobody listens now


# --------------------------------------------------------------------------- runner
class InstantTarget(QuietTarget):
    """Answers every request at once with `max_tokens` tokens."""

    async def generate(self, req: BenchRequest, record: RequestRecord) -> None:
        record.first_token_s = record.end_s = self.now_s()
        record.output_tokens, record.success = req.max_tokens, True



def _workload() -> Workload:
    reqs = tuple(BenchRequest(f"r{i}", prompt_token_ids=[1, 2, 3], max_tokens=2)
                 for i in range(4))
    return Workload(name="tiny", seed=0, params={}, requests=reqs)


def test_run_is_invalid_when_the_injected_watch_is_busy() -> None:
    closed = ArrivalSpec("closed", concurrency=2)
    busy = run(InstantTarget(), _workload(), closed, warmup_requests=0,
               cpu_watch=FixedCpuWatch(0.6))
    assert not busy.validity.valid and busy.validity.disturbed
    assert busy.validity.other_cpu_share == 0.6
    assert busy.validity.max_other_cpu_share == DEFAULT_MAX_OTHER_CPU_SHARE == 0.25
    assert busy.validity.reasons == [cpu_reason(0.6, 0.25)]
    assert busy.metrics()["completed"] == 4  # the rows are kept, marked
    quiet = run(InstantTarget(), _workload(), closed, warmup_requests=0,
                cpu_watch=FixedCpuWatch(0.1))
    assert quiet.validity.valid and quiet.validity.other_cpu_share == 0.1
    lax = run(InstantTarget(), _workload(), closed, warmup_requests=0,
              cpu_watch=FixedCpuWatch(0.6), max_other_cpu_share=0.7)
    assert lax.validity.valid
    with pytest.raises(ValueError, match=r"max_other_cpu_share \(2\) must be a share"):
        run(InstantTarget(), _workload(), closed, max_other_cpu_share=2)


def test_the_suite_states_a_quiet_machine() -> None:
    """tests/conftest.py: results never depend on the load of the machine running them."""
    assert os.environ[STATED_SHARE_ENV] == "0"
    res = run(InstantTarget(), _workload(), ArrivalSpec("closed", concurrency=1),
              warmup_requests=0)
    assert res.validity.valid and res.validity.other_cpu_share == 0.0
