"""`workbench bench client-capacity`: the ceiling logic and the step judgement on injected
results (no clock, no machine load), vLLM's client path through a fake `vllm` executable
(and skipped without one), the table and JSON of a real tiny run with an injected CPU watch
(only their structure is checked, never a speed), and the config's refusals."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from workbench.bench.client_capacity import cli as cc
from workbench.bench.client_capacity.cli import plan_cores
from workbench.bench.client_capacity.config import ClientCapacityConfig
from workbench.bench.client_capacity.ours import step_from_run
from workbench.bench.client_capacity.report import ClientCapacity
from workbench.bench.client_capacity.steps import (
    ALL_FAILURES,
    StepFailed,
    StepResult,
    find_ceiling,
    step_status,
    sweep,
)
from workbench.bench.client_capacity.vllm import (
    VLLM_DRIVER,
    parse_vllm_result,
    vllm_command,
    vllm_plan,
)
from workbench.harness.loop_lag import ReadLag
from workbench.harness.validity import FixedCpuWatch, Validity, lateness_table


def _step(rate: float, status: str, client: str = "workbench", **kw: Any) -> StepResult:
    base: dict[str, Any] = dict(
        client=client, rate=rate, requests=10, achieved_rate=rate, scheduled_rate=rate,
        chunks_per_s=rate * 4, read_ratio=1.0, median_lateness_ms=1.0, p95_lateness_ms=2.0,
        client_cpu=0.5, server_cpu=0.1, others_cpu=0.0, failed=0, status=status)
    return StepResult(**{**base, **kw})


# --------------------------------------------------------------------------- the ceiling
@pytest.mark.parametrize(("statuses", "rate", "failed_at", "judged"), [
    (["ok", "ok", "late"], 200.0, 400.0, 3),
    (["ok", "disturbed", "ok", "late"], 400.0, 800.0, 3),  # a disturbed step is skipped
    (["ok", "ok", "disturbed", "late"], 200.0, 800.0, 3),
    (["late", "ok"], None, 100.0, 2),  # the lowest rate already fell behind
    (["ok", "ok", "ok", "ok"], 800.0, None, 4),  # a lower bound only
    (["disturbed", "disturbed"], None, None, 0),
    (["ok", "failed", "ok"], 100.0, 200.0, 3),
    (["ok", "slow-read", "late"], 200.0, 400.0, 3),  # reading is not the send schedule
])
def test_find_ceiling(statuses: list[str], rate: float | None, failed_at: float | None,
                      judged: int) -> None:
    steps = [_step(r, s) for r, s in zip((100.0, 200.0, 400.0, 800.0), statuses,
                                          strict=False)]
    c = find_ceiling(list(reversed(steps)))  # order does not matter
    assert (c.rate, c.failed_at, c.judged) == (rate, failed_at, judged)


def test_read_ceiling_and_texts() -> None:
    steps = [_step(100, "ok"), _step(200, "slow-read"), _step(400, "late")]
    assert find_ceiling(steps, ALL_FAILURES).rate == 100
    assert find_ceiling(steps, ALL_FAILURES).text() == (
        "100 req/s (the next judged step, 200 req/s, fell behind)")
    assert find_ceiling([_step(100, "ok")]).text() == (
        ">= 100 req/s (no step fell behind: add higher --rates)")
    assert find_ceiling([_step(100, "late")]).text() == (
        "below 100 req/s (the lowest judged rate fell behind)")
    assert find_ceiling([_step(100, "disturbed")]).text() == (
        "no ceiling: every step was disturbed")


@pytest.mark.parametrize(("args", "status"), [
    ((True, 3, False, False), "disturbed"),
    ((False, 3, False, False), "failed"),
    ((False, 0, False, False), "late"),
    ((False, 0, True, False), "slow-read"),
    ((False, 0, True, True), "ok"),
])
def test_step_status_precedence(args: tuple[bool, int, bool, bool], status: str) -> None:
    assert step_status(*args) == status


def test_sweep_redoes_disturbed_steps_and_stops_after_late_ones() -> None:
    config = ClientCapacityConfig(rates=(1, 2, 3, 4, 5, 6), stop_after=2, redo_disturbed=1)
    script = {1: ["ok"], 2: ["disturbed", "ok"], 3: ["late"], 4: ["disturbed", "disturbed"],
              5: ["failed"], 6: ["ok"]}
    calls: list[float] = []

    def step(rate: float) -> StepResult:
        calls.append(rate)
        return _step(rate, script[int(rate)].pop(0))

    lines: list[str] = []
    steps, failure = sweep(config, step, lines.append)
    assert failure is None and calls == [1, 2, 2, 3, 4, 4, 5]  # stops after 3, (4), 5
    assert [(s.rate, s.status, s.attempts) for s in steps] == [
        (1, "ok", 1), (2, "ok", 2), (3, "late", 1), (4, "disturbed", 2), (5, "failed", 1)]
    # a slow-read step does not stop the climb: the send side decides (the harness's check)
    script = {1: ["slow-read"], 2: ["slow-read"], 3: ["slow-read"], 4: ["late"], 5: ["late"],
              6: ["ok"]}
    calls.clear()
    steps, _ = sweep(config, step)
    assert calls == [1, 2, 3, 4, 5]
    assert lines[3] == ("  workbench 4 req/s: INVALID (disturbed), 16 chunks/s, client CPU 50%, "
                        "others' 0%")

    def broken(rate: float) -> StepResult:
        if rate > 1:
            raise StepFailed("it broke")
        return _step(rate, "ok")

    steps, failure = sweep(config, broken)
    assert [s.rate for s in steps] == [1] and failure == "it broke"


def test_plan_cores() -> None:
    assert plan_cores({0, 1}) == ({0}, {1})
    assert plan_cores({7, 2, 5}) == ({2}, {5})
    assert plan_cores({3}) is None


# --------------------------------------------------------------------------- one step judged
def _run_result(lateness_s: float, duration_s: float, others: float = 0.0,
                failed: int = 0) -> Any:
    from workbench.harness.arrivals import ArrivalSpec
    from workbench.harness.metrics import RequestRecord
    from workbench.harness.replay import RunResult
    from workbench.harness.validity import check_validity

    arrival = ArrivalSpec(mode="constant", rate=10.0)
    records = []
    for i in range(10):
        t = i / 10
        rec = RequestRecord(f"r{i}", 3, 4, i >= failed, target_arrival_s=t,
                            start_s=t + lateness_s, chunk_times_s=[t + lateness_s] * 4)
        records.append(rec)
    v = check_validity(records, arrival, duration_s)
    v.judge_cpu(others, 0.25)
    return RunResult(records, duration_s, True, arrival.to_dict(), "warm-model", "x", "w", v,
                     [], {}, {}, {})


@pytest.mark.parametrize(("lateness", "duration", "others", "failed", "status", "ratio"), [
    (0.001, 0.9, 0.0, 0, "ok", 1.0),
    (0.001, 1.8, 0.0, 0, "slow-read", 0.5),  # the chunks took twice the schedule's span
    (0.1, 1.0, 0.0, 0, "late", 0.9),  # a median lateness of 100 ms > 50 ms
    (0.1, 1.0, 0.6, 0, "disturbed", 0.9),
    (0.001, 0.9, 0.0, 2, "failed", 1.0),
])
def test_step_from_run(lateness: float, duration: float, others: float, failed: int,
                       status: str, ratio: float) -> None:
    config = ClientCapacityConfig(output_len=4)
    step = step_from_run(config, 10.0, _run_result(lateness, duration, others, failed),
                         0.4, 0.1)
    assert step.status == status and step.read_ratio == pytest.approx(ratio)
    assert step.chunks_per_s == pytest.approx(40 / duration) and step.failed == failed
    assert step.median_lateness_ms == pytest.approx(lateness * 1e3)
    assert (step.client_cpu, step.server_cpu, step.others_cpu) == (0.4, 0.1, others)
    assert step.scheduled_rate == pytest.approx(10.0)
    if status == "slow-read":
        assert step.reasons == ["received 22 chunks/s, 50% of those offered: the client fell "
                                "behind reading the streams"]


def test_step_from_run_judges_the_read_lag_with_the_harness_check() -> None:
    """Sends on time, every chunk received, but the read loop woke 30 ms late at p95: the
    shared `validity.read_lag_reason` makes it slow-read, even where the runner recorded the
    lag without judging it (the suite's stated CPU share)."""
    from workbench.harness.validity import read_lag_reason

    lag = ReadLag(samples=90, p50_s=0.004, p95_s=0.03, max_s=0.06, cpu_share=0.99)
    res = _run_result(0.001, 0.9)
    res.validity.judge_read_lag(lag, None)  # recorded only
    step = step_from_run(ClientCapacityConfig(output_len=4), 10.0, res, 0.99, 0.1)
    assert step.status == "slow-read" and step.read_ratio == pytest.approx(1.0)
    assert (step.read_lag_p50_ms, step.read_lag_p95_ms) == pytest.approx((4.0, 30.0))
    assert step.reasons == [read_lag_reason(lag, 0.02)]
    res = _run_result(0.001, 0.9)
    res.validity.judge_read_lag(lag, 0.02)  # judged by the runner too: one reason, not two
    step = step_from_run(ClientCapacityConfig(output_len=4), 10.0, res, 0.99, 0.1)
    assert step.status == "slow-read" and step.reasons == [read_lag_reason(lag, 0.02)]
    res = _run_result(0.001, 0.9)
    res.validity.judge_read_lag(ReadLag(90, 0.0005, 0.002, 0.009, 0.3), None)
    assert step_from_run(ClientCapacityConfig(output_len=4), 10.0, res, 0.3, 0.1).status == "ok"


def test_lateness_table_in_the_harness_report() -> None:
    assert lateness_table(Validity()) is None  # a closed loop schedules nothing
    v = Validity(target_rate=10.0, achieved_rate=9.5, median_lateness_s=0.0012,
                 p95_lateness_s=0.0105)
    assert lateness_table(v) == "\n".join([
        "| Client schedule (open loop) | |", "|---|---:|",
        "| Median lateness, send - scheduled (ms) | 1.20 |", "| P95 lateness (ms) | 10.50 |",
        "| Send rate achieved / scheduled (req/s) | 9.50 / 10.00 |",
        "| Invalid above a median lateness of (ms) | 50.0 |"])


# --------------------------------------------------------------------------- vLLM's client
def test_vllm_command_and_plan(tmp_path: Path) -> None:
    config = ClientCapacityConfig(arrival="constant", max_concurrency=8, vllm_venv=tmp_path)
    cmd = vllm_command(Path("/v/bin/python"), config, "http://127.0.0.1:9", 50.0, "/tok",
                       "/out")
    assert cmd[:3] == ["/v/bin/python", "-c", VLLM_DRIVER]
    assert "from vllm.benchmarks.serve import add_cli_args, main" in VLLM_DRIVER
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert {k: flags[k] for k in ("--backend", "--base-url", "--endpoint", "--dataset-name",
                                  "--random-input-len", "--random-output-len", "--num-prompts",
                                  "--request-rate", "--burstiness", "--max-concurrency")} == {
        "--backend": "openai", "--base-url": "http://127.0.0.1:9",
        "--endpoint": "/v1/completions", "--dataset-name": "random",
        "--random-input-len": "32", "--random-output-len": "64", "--num-prompts": "200",
        "--request-rate": "50.0", "--burstiness": "inf", "--max-concurrency": "8"}
    assert {"--ignore-eos", "--save-result", "--save-detailed", "--disable-tqdm"} <= set(cmd)
    assert vllm_plan(config) == (None, f"skipped: {tmp_path}/bin/vllm does not exist (build "
                                       "it with `make peer-vllm`)")
    assert vllm_plan(ClientCapacityConfig(vllm=False)) == (None, "skipped (--no-vllm)")


def test_parse_vllm_result() -> None:
    data = {"duration": 2.0, "completed": 3, "failed": 1, "total_output_tokens": 99,
            "itls": [[0.1, 0.1], [0.1], [], []], "errors": ["", "", "", "boom"]}
    step = parse_vllm_result(data, 1.5, cpu_s=0.5, wall_s=2.0, others=0.1, threshold=0.25)
    assert (step.client, step.chunks_per_s, step.achieved_rate) == ("vllm", 3.0, 1.5)
    assert (step.client_cpu, step.failed, step.status) == (0.25, 1, "failed")
    data.update(failed=0, itls=None)  # not detailed: chunks = output tokens
    step = parse_vllm_result(data, 1.5, None, None, others=None, threshold=0.25)
    assert (step.chunks_per_s, step.status, step.client_cpu) == (49.5, "ok", None)
    assert parse_vllm_result(data, 2.0, None, None, None, 0.25).status == "late"  # 1.5 < 1.9
    assert parse_vllm_result(data, 1.5, None, None, 0.3, 0.25).status == "disturbed"


def _fake_vllm(venv: Path, fail: bool = False) -> Path:
    """A venv whose python answers like `vllm bench serve`: its marker lines and a result
    JSON of every prompt completed at exactly the rate asked, one chunk per output token."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("")  # only its existence counts
    exe = venv / "bin" / "python"
    exe.write_text(f"#!{sys.executable}\n" + (
        "print('boom: no vllm here'); raise SystemExit(1)\n" if fail else """
import json, os, sys
a = sys.argv
get = lambda k: a[a.index(k) + 1]
n, out = int(get("--num-prompts")), int(get("--random-output-len"))
rate = float(get("--request-rate"))
print("Starting main benchmark run...", flush=True)
print("=============== Serving Benchmark Result ===============", flush=True)
data = {"duration": n / rate, "completed": n, "failed": 0, "total_output_tokens": n * out,
        "itls": [[0.001] * (out - 1)] * n, "errors": [""] * n}
with open(os.path.join(get("--result-dir"), get("--result-filename")), "w") as f:
    json.dump(data, f)
"""))
    exe.chmod(0o755)
    return venv


def test_tiny_run_table_json_and_vllms_client(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    venv = _fake_vllm(tmp_path / "venv")
    out = tmp_path / "cc.json"
    # measure() calls: ours 20 (0.0), ours 40 (0.9: redone, 0.0), vLLM 20 and 40 (0.0)
    code = cc.main(["--rates", "20,40", "--duration-s", "0.5", "--input-len", "3",
                    "--output-len", "4", "--no-pin", "--vllm-venv", str(venv), "--json",
                    str(out), "--strict"], watch=FixedCpuWatch(0.0, 0.9, 0.0))
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data) == {"date", "cpu", "pinning", "config", "max_median_lateness_ms",
                         "max_p95_read_lag_ms",
                         "min_rate_fraction", "steps", "vllm_steps", "vllm_note", "ceiling",
                         "read_ceiling", "vllm_ceiling", "disturbed", "cpu_us_per_chunk"}
    assert data["pinning"] is None and data["max_median_lateness_ms"] == 50.0
    assert data["max_p95_read_lag_ms"] == 20.0
    assert [(s["rate"], s["attempts"], s["requests"]) for s in data["steps"]] == [
        (20.0, 1, 10), (40.0, 2, 20)]
    assert all(s["status"] in ("ok", "late", "slow-read") and s["failed"] == 0
               and s["client_cpu"] is not None and s["median_lateness_ms"] is not None
               and s["read_lag_p95_ms"] is not None
               for s in data["steps"])
    assert [(s["rate"], s["status"], s["chunks_per_s"], s["achieved_rate"])
            for s in data["vllm_steps"]] == [(20.0, "ok", 80.0, 20.0), (40.0, "ok", 160.0, 40.0)]
    assert all(s["client_cpu"] is not None for s in data["vllm_steps"])
    assert data["vllm_ceiling"]["rate"] == 40.0 and data["vllm_note"] is None
    text = capsys.readouterr().out
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert len(table) == 2 + 2 and table[0].startswith("| rate req/s | ours: starts/s")
    assert all(ln.count("|") == table[0].count("|") for ln in table)
    assert "ceiling, vLLM bench serve (completed/s keeps up): >= 40 req/s" in text


def test_missing_and_failing_vllm_are_one_line_each(tmp_path: Path) -> None:
    base = dict(rates=(20.0,), duration_s=0.3, input_len=2, output_len=2, pin=False)
    config = ClientCapacityConfig(**base, vllm_venv=_fake_vllm(tmp_path / "bad", fail=True))
    result = cc.measure(config, FixedCpuWatch(0.0), print_line=None)
    assert [s.rate for s in result.steps] == [20.0] and result.vllm_steps == []
    assert result.vllm_note is not None and result.vllm_note.startswith(
        "failed: vllm bench serve exited with 1 at 20 req/s: boom: no vllm here")
    assert f"vLLM bench serve: {result.vllm_note}" in result.summary()
    result.vllm_note = vllm_plan(ClientCapacityConfig(vllm_venv=tmp_path / "none"))[1]
    assert result.summary().splitlines()[-1] == (
        f"vLLM bench serve: skipped: {tmp_path}/none/bin/vllm does not exist (build it with "
        "`make peer-vllm`)")


def test_table_of_injected_steps() -> None:
    config = ClientCapacityConfig(rates=(100, 200), vllm=False)
    result = ClientCapacity(
        config, "CPU X", {"client": [0], "mock": [1]},
        [_step(100, "ok", read_lag_p50_ms=0.5, read_lag_p95_ms=1.25),
         _step(200, "late", server_cpu=0.95, others_cpu=None)],
        [_step(100, "ok", "vllm", chunks_per_s=200.0, median_lateness_ms=None,
               p95_lateness_ms=None, client_cpu=0.25, others_cpu=0.3)],
        None, date="2026-12-02T00:00:00+00:00")
    assert result.table().splitlines()[2:] == [
        "| 100 | 100.0 (100.0) | 400 (100%) | 1.00 / 2.00 | 0.50 / 1.25 | 50% | 1,250.0 | 10% / 0% "
        "| ok | 100.0 | 200 | 25% | 1,250.0 | 10% / 30% | ok | 1.00x |",
        "| 200 | 200.0 (200.0) | 800 (100%) | 1.00 / 2.00 | - | 50% | 625.0 | 95% / - | late | - "
        "| - | - | - | - | - | - |"]
    assert result.summary().splitlines() == [
        "ceiling, workbench harness (sends on schedule): 100 req/s (the next judged step, "
        "200 req/s, fell behind)",
        "ceiling, workbench harness (sends and reads keep up): 100 req/s (the next judged "
        "step, 200 req/s, fell behind)",
        "ceiling, vLLM bench serve (completed/s keeps up): >= 100 req/s (no step fell behind: "
        "add higher --rates)",
        "ceiling ratio, ours (sends and reads) / vLLM's: 1.00x",
        "client CPU per chunk, median of the 1 rates where both kept up: ours 1250.0 µs, "
        "vLLM's 1250.0 µs (ours / vLLM's 1.00x)",
        "note: the mock used > 90% of its core at 200 (workbench) req/s: there the mock, not "
        "the client, may have set the pace"]
    doc = json.loads(json.dumps(result.as_dict()))
    assert doc["ceiling"] == {"rate": 100.0, "failed_at": 200.0, "judged": 2,
                              "text": result.ceiling.text()}
    assert doc["cpu"] == "CPU X" and doc["disturbed"] is False
    assert doc["steps"][0]["cpu_us_per_chunk"] == 1250.0
    assert doc["cpu_us_per_chunk"] == {"workbench": 1250.0, "vllm": 1250.0,
                                       "rates_both_ok": [100.0]}
    result.vllm_steps = []
    assert result.summary().splitlines()[-2] == (
        "client CPU per chunk, median of the rates it kept up: 1250.0 µs")


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("kw", "needle"), [
    ({"rates": ()}, "rates must be finite request rates > 0 (req/s), got ()"),
    ({"rates": (10, -1)}, "rates must be finite request rates > 0"),
    ({"rates": (10, float("inf"))}, "rates must be finite request rates > 0"),
    ({"rates": (20, 10)}, "rates must rise strictly"),
    ({"duration_s": 0}, "duration_s must be seconds in (0, 600], got 0"),
    ({"output_len": 0}, "output_len must be an integer >= 1, got 0"),
    ({"stop_after": 1.5}, "stop_after must be an integer >= 1, got 1.5"),
    ({"redo_disturbed": -1}, "redo_disturbed must be an integer >= 0, got -1"),
    ({"seed": True}, "seed must be an integer >= 0, got True"),
    ({"arrival": "gamma"}, "arrival must be one of ['poisson', 'constant'], got 'gamma'"),
    ({"max_concurrency": 0}, "max_concurrency must be an integer >= 1 or None, got 0"),
    ({"token_delay_s": -0.1}, "token_delay_s must be seconds in [0, 60), got -0.1"),
    ({"max_other_cpu_share": 1.5}, "max_other_cpu_share must be in [0, 1], got 1.5"),
])
def test_config_refuses_bad_values(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError) as e:
        ClientCapacityConfig(**kw)
    assert needle in str(e.value)


def test_cli_refuses_a_bad_rate_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cc.main(["--rates", "10,abc"])
    assert "--rates '10,abc'" in capsys.readouterr().err
    assert os.sched_getaffinity(0)  # nothing was pinned
