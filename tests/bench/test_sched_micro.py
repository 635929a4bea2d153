"""The scheduler micro-benchmark judges its run by the CPU share other processes took."""

from __future__ import annotations

import pytest

from workbench.bench.micro import sched as sched_micro
from workbench.harness.validity import FixedCpuWatch


def test_quiet_run_is_valid_and_reports_the_share() -> None:
    r = sched_micro.measure(num_requests=8, prompt_len=16, steps=5, watch=FixedCpuWatch(0.1))
    assert r["valid"] is True and r["other_cpu_share"] == 0.1
    assert r["num_requests"] == 8 and r["steps"] == 5


def test_disturbed_run_is_marked_and_strict_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    r = sched_micro.measure(num_requests=8, prompt_len=16, steps=5, watch=FixedCpuWatch(0.6))
    assert r["valid"] is False
    monkeypatch.setenv("WORKBENCH_OTHER_CPU_SHARE", "0.6")
    with pytest.raises(SystemExit) as exc:
        sched_micro.main(["--num-requests", "8", "--steps", "5", "--prompt-len", "16",
                          "--strict"])
    assert exc.value.code == 2
    out = capsys.readouterr().out
    assert "| 60% |" in out
    assert ("INVALID bench sched: other processes used 60% of the CPUs (threshold 25%); "
            "not used for any result") in out
    assert "target <= 0.5 ms" not in out
