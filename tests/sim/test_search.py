"""`workbench sim-search` (workbench/sim/search*.py): the grid's points, the choice worked out by
hand on the analytic model (two requests, step_noise 0: every TTFT and TPOT is one step's
predicted time), "none meets" stated with the closest point, a point that cannot run, serial
and pool fan-out giving the same table, the spec's refusals and the CLI verb."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from workbench import cli
from workbench.errors import UserError
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.batch import BatchComposition
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.search import ROW_COLUMNS, choose, run_points, search
from workbench.sim.search_cli import format_table
from workbench.sim.search_spec import SearchSpec

TARGET = {"model": "Llama-3-8B", "hardware": "H100-SXM", "step_noise": 0,
          "router_policy": "round_robin"}
PROMPT = 128


def _spec(**over: Any) -> SearchSpec:
    data: dict[str, Any] = {
        "name": "tiny", "target": dict(TARGET),
        "workload": {"fixture": "balanced-chat", "seed": 0},
        "arrivals": {"mode": "poisson", "rate": "inf"},
        "slo": {"ttft_ms": 1000, "tpot_ms": 100, "attainment": 1.0},
        "engine": {"max_model_len": 1024},
        "grid": {"tensor_parallel_size": [1, 2], "num_instances": [1, 2]},
    }
    data.update(over)
    return SearchSpec.from_dict(data)


def _two_requests() -> Workload:
    """Two 128-token prompts (no shared block), two output tokens each."""
    return Workload("two", 0, {}, tuple(
        BenchRequest(f"r{i}", list(range(1000 * (i + 1), 1000 * (i + 1) + PROMPT)), 2)
        for i in range(2)))


def _steps(tp: int, seqs: int) -> tuple[float, float]:
    """(prefill step, decode step) seconds for `seqs` of the two requests in one instance."""
    cost = AnalyticCostModel("Llama-3-8B", "H100-SXM", tensor_parallel_size=tp)
    prefill = cost.step_time_s(BatchComposition(
        prefill_tokens=seqs * PROMPT, prefill_attn_pairs=seqs * PROMPT * (PROMPT + 1) // 2,
        num_seqs=seqs, sampled_rows=seqs))
    decode = cost.step_time_s(BatchComposition(
        decode_tokens=seqs, decode_context_tokens=seqs * (PROMPT + 1), num_seqs=seqs,
        sampled_rows=seqs))
    return prefill, decode


# (tp, instances) in grid order -> (prefill, decode): one instance batches both requests
HAND = {(1, 1): _steps(1, 2), (1, 2): _steps(1, 1), (2, 1): _steps(2, 2), (2, 2): _steps(2, 1)}


def test_the_grid_expands_in_axis_order_with_the_gpus_each_costs() -> None:
    spec = _spec(grid={"max_num_seqs": [8, 64], "num_instances": [1, 4],
                       "tensor_parallel_size": [2]}, engine={"pipeline_parallel_size": 2})
    got = [(p.index, p.tensor_parallel_size, p.pipeline_parallel_size, p.num_instances,
            p.max_num_seqs, p.max_num_batched_tokens, p.num_gpus) for p in spec.points()]
    assert got == [(0, 2, 2, 1, 8, None, 4), (1, 2, 2, 1, 64, None, 4),
                   (2, 2, 2, 4, 8, None, 16), (3, 2, 2, 4, 64, None, 16)]
    p = spec.points()[3]
    assert spec.point_target(p) == {"kind": "simulated", **TARGET, "num_instances": 4}
    assert spec.point_config(p) == {"pipeline_parallel_size": 2, "tensor_parallel_size": 2,
                                    "max_num_seqs": 64}


def test_the_cheapest_point_meeting_the_slo_is_chosen_as_worked_out_by_hand() -> None:
    # the hand-worked order: a lone 128-token prefill at tp 2 < both at tp 2 < a lone one at
    # tp 1 < both at tp 1; the TTFT bound sits between the last two, so only (tp 1, 1
    # instance) misses it
    assert HAND[2, 2][0] < HAND[2, 1][0] < HAND[1, 2][0] < HAND[1, 1][0]
    bound = (HAND[1, 2][0] + HAND[1, 1][0]) / 2 * 1000
    spec = _spec(slo={"ttft_ms": bound, "tpot_ms": 100, "attainment": 1.0})
    result = search(spec, workload=_two_requests(), backend="serial")
    rows = result.rows
    assert [list(r) for r in rows] == [list(ROW_COLUMNS)] * 4
    for row, (tp, inst) in zip(rows, HAND, strict=True):
        prefill, decode = HAND[tp, inst]
        assert (row["tensor_parallel_size"], row["num_instances"]) == (tp, inst)
        assert row["num_gpus"] == tp * inst and row["error"] is None and row["failed"] == 0
        assert row["p95_ttft_ms"] == pytest.approx(prefill * 1000, rel=1e-9)
        assert row["median_tpot_ms"] == pytest.approx(decode * 1000, rel=1e-9)
        assert row["goodput"] == pytest.approx(
            (2 if (tp, inst) != (1, 1) else 0) / (prefill + decode), rel=1e-9)
    assert [r["meets_slo"] for r in rows] == [False, True, True, True]
    assert [r["slo_attainment"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    # two GPUs either way (tp 1 x 2 instances, tp 2 x 1): the higher goodput, tp 2, wins
    assert sum(HAND[2, 1]) < sum(HAND[1, 2])
    assert result.chosen is rows[2]
    assert result.verdict() == (
        f"chosen: point 2, 2 GPUs (tp 2, pp 1, 1 instance, budget default, max_num_seqs "
        f"default): 100.0% of requests within the SLO (TTFT <= {bound:g} ms and TPOT <= 100 "
        f"ms for >= 100% of requests at a burst (every request at t = 0)), goodput "
        f"{rows[2]['goodput']:.2f} req/s")


def test_an_slo_no_point_meets_says_none_meets_and_names_the_closest() -> None:
    bound = HAND[2, 2][0] * 1000 / 2  # below the fastest TTFT of all
    spec = _spec(slo={"ttft_ms": bound, "tpot_ms": 100, "attainment": 0.9})
    result = search(spec, workload=_two_requests(), backend="serial")
    assert [r["meets_slo"] for r in result.rows] == [False] * 4
    assert result.chosen is None
    assert result.verdict() == (
        f"none meets the SLO (TTFT <= {bound:g} ms and TPOT <= 100 ms for >= 90% of requests "
        "at a burst (every request at t = 0)): the closest is point 0, 1 GPUs (tp 1, pp 1, "
        "1 instance, budget default, max_num_seqs default), 0.0% within it; widen the grid "
        "(more instances, TP) or relax the SLO")
    table = format_table(result)
    assert "*" not in table and table.count(" no") == 4


def test_a_point_that_cannot_hold_the_weights_is_an_error_row_never_chosen() -> None:
    spec = _spec(target={**TARGET, "model": "Llama-3-70B", "hardware": "L40S"},
                 grid={"tensor_parallel_size": [1, 4]})
    result = search(spec, workload=_two_requests(), backend="serial")
    first, second = result.rows
    assert first["error"].startswith("L40S: the weights leave no room for a KV pool")
    assert first["meets_slo"] is False and first["goodput"] is None
    assert second["error"] is None and second["num_gpus"] == 4
    assert result.chosen is second
    assert "error: L40S: the weights leave no room" in format_table(result).splitlines()[1]


def test_choose_orders_by_gpus_then_goodput_then_attainment_then_ttft_then_index() -> None:
    def row(i: int, gpus: int, goodput: float, att: float = 1.0, ttft: float = 1.0,
            meets: bool = True) -> dict[str, Any]:
        return {"index": i, "num_gpus": gpus, "goodput": goodput, "slo_attainment": att,
                "p95_ttft_ms": ttft, "meets_slo": meets}

    rows = [row(0, 1, 9.0, meets=False), row(1, 2, 5.0), row(2, 2, 6.0, 0.95),
            row(3, 2, 6.0, 0.97, 3.0), row(4, 2, 6.0, 0.97, 2.0), row(5, 2, 6.0, 0.97, 2.0),
            row(6, 4, 50.0)]
    assert choose(rows) is rows[4]
    assert choose([row(0, 1, 1.0, meets=False)]) is None


def test_serial_and_pool_fan_out_give_identical_rows_and_tables() -> None:
    wl = Workload("mixed", 0, {}, tuple(
        BenchRequest(f"r{i}", list(range(1000 * i, 1000 * i + 32 + 16 * (i % 5))), 4 + i % 7)
        for i in range(24)))
    spec = _spec(target={**TARGET, "step_noise": 0.05},  # seeded noise: still deterministic
                 arrivals={"mode": "poisson", "rate": 200.0, "seed": 3},
                 slo={"ttft_ms": 20, "tpot_ms": 12, "attainment": 0.8},
                 grid={"num_instances": [1, 2], "max_num_seqs": [2, 16]})
    serial = run_points(spec, wl, "serial")
    pooled = run_points(spec, wl, "pool", workers=2)
    assert serial == pooled and len(serial) == 4
    assert len({r["p95_ttft_ms"] for r in serial}) == 4  # four different runs, not one
    a = search(spec, workload=wl, backend="serial")
    b = search(spec, workload=wl, backend="pool", workers=2)
    assert (a.backend, b.backend) == ("serial", "pool of 2 processes")
    assert format_table(a) == format_table(b) and a.verdict() == b.verdict()


@pytest.mark.parametrize(("over", "message"), [
    ({"grids": {}}, "search spec: 'grids' is not a search spec key (did you mean 'grid'?) "
                    "(keys: name, target, workload, arrivals, slo, engine, grid, repeat)"),
    ({"grid": {"tensor_paralel_size": [1]}},
     "search spec 'tiny': grid.tensor_paralel_size is not a search axis (did you mean "
     "'tensor_parallel_size'?) (axes: tensor_parallel_size, pipeline_parallel_size, "
     "num_instances, pd, max_num_batched_tokens, max_num_seqs)"),
    ({"grid": {"num_instances": [0, 2]}},
     "search spec 'tiny': grid.num_instances value 0 must be an integer >= 1"),
    ({"engine": {"max_num_seqs": 8}, "grid": {"max_num_seqs": [4]}},
     "search spec 'tiny': max_num_seqs is both in engine (8) and a grid axis; keep one"),
    ({"arrivals": {"mode": "closed", "concurrency": 4}},
     "search spec 'tiny': arrivals.mode ('closed') must be an open loop (poisson, gamma, "
     "constant or trace): the search asks for a target rate"),
    ({"slo": {"ttft_ms": 100, "tpot_ms": 10, "attainment": 90}},
     "search spec slo: GoodputSLO attainment (90) must be a share in (0, 1], e.g. 0.9 (90% "
     "of requests meet the SLO)"),
    ({"slo": {"ttft_ms": 100}}, "search spec slo ({'ttft_ms': 100}) takes ttft_ms, tpot_ms "
     "(bounds in ms) and attainment (the share of requests that must meet both, default 0.9)"),
    ({"engine": {"max_model_len": 1024, "max_num_seq": 8}},
     "search spec 'tiny': engine knob 'max_num_seq' is not modelled by the simulator"),
    ({"workload": {"fixture": "chat"}}, "search spec 'tiny': workload.fixture ('chat') must "
     "be one of"),
])
def test_a_bad_spec_is_refused_naming_the_field_and_what_is_allowed(
        over: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError) as e:
        _spec(**over)
    assert str(e.value).startswith(message)


def test_a_pd_axis_needs_the_targets_split(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.sim import target

    monkeypatch.setattr(target, "TARGET_KEYS", ("kind", "model", "hardware", "num_instances"))
    with pytest.raises(UserError, match=r"grid.pd needs a simulated target with num_prefill "
                                        r"and num_decode, which this build's does not have"):
        _spec(grid={"pd": ["1:3"]})


def test_a_pd_axis_splits_the_instances_and_counts_their_gpus() -> None:
    with pytest.raises(UserError, match="kv_transfer"):  # the split needs its KV link
        _spec(grid={"pd": ["1:1"]})
    spec = _spec(target={**TARGET, "kv_transfer": {"link": "400gbe"}},
                 grid={"tensor_parallel_size": [1, 2], "pd": ["1:1", [1, 2]]})
    assert [(p.tensor_parallel_size, p.layout, p.num_gpus) for p in spec.points()] == [
        (1, "1:1", 2), (1, "1:2", 3), (2, "1:1", 4), (2, "1:2", 6)]
    assert spec.point_target(spec.points()[1]) == {
        "kind": "simulated", **TARGET, "kv_transfer": {"link": "400gbe"}, "num_prefill": 1,
        "num_decode": 2}
    assert spec.as_dict()["grid"]["pd"] == ["1:1", "1:2"]
    result = search(spec, workload=_two_requests(), backend="serial")
    assert [(r["num_gpus"], r["num_instances"], r["meets_slo"], r["error"])
            for r in result.rows] == [(2, 2, True, None), (3, 3, True, None),
                                      (4, 2, True, None), (6, 3, True, None)]
    assert result.chosen is result.rows[0]
    assert " 1:2 " in format_table(result).splitlines()[2]


def _write_spec(tmp_path: Path, **over: Any) -> Path:
    data: dict[str, Any] = {
        "name": "cli", "target": dict(TARGET),
        "workload": {"fixture": "balanced-chat", "seed": 0, "params": {"num_requests": 6}},
        "arrivals": {"mode": "poisson", "rate": 20.0, "seed": 0},
        "slo": {"ttft_ms": 1000, "tpot_ms": 100, "attainment": 0.9},
        "engine": {"max_model_len": 1024}, "grid": {"num_instances": [1, 2]}}
    data.update(over)
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_cli_prints_every_point_marks_the_chosen_and_writes_json_and_csv(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_spec(tmp_path)
    cli.main(["sim-search", "--config", str(path), "--serial", "--out",
              str(tmp_path / "out.json")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("search 'cli': Llama-3-8B on H100-SXM, 2 points (serial, ")
    assert lines[1].split() == ["#", "GPUs", "TP", "PP", "inst", "budget", "seqs", "in", "SLO",
                                "goodput/s", "p95", "TTFT", "ms", "med", "TPOT", "ms", "meets"]
    assert lines[2].startswith("* ") and lines[2].split()[1:3] == ["0", "1"]
    assert lines[3].startswith("  ") and lines[3].split()[-1] == "yes"
    assert lines[4].startswith("chosen: point 0, 1 GPUs (tp 1, pp 1, 1 instance,")
    assert lines[5] == f"wrote {tmp_path / 'out.json'}"
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["chosen"]["index"] == 0 and [r["index"] for r in saved["rows"]] == [0, 1]
    assert SearchSpec.from_dict(saved["spec"]).points() == _spec_from(path).points()
    with pytest.raises(SystemExit) as e:  # --out .csv, and an SLO nothing meets: status 1
        cli.main(["sim-search", "--config", str(_write_spec(tmp_path, slo={
            "ttft_ms": 0.001, "tpot_ms": 100})), "--serial", "--out", str(tmp_path / "o.csv")])
    assert e.value.code == 1
    assert capsys.readouterr().out.splitlines()[-2].startswith("none meets the SLO")
    header, *body = (tmp_path / "o.csv").read_text().splitlines()
    assert header == ",".join([*ROW_COLUMNS, "chosen"]) and len(body) == 2
    assert all(line.endswith(",False") for line in body)


def _spec_from(path: Path) -> SearchSpec:
    return SearchSpec.from_dict(yaml.safe_load(path.read_text()))


def test_the_cli_refuses_a_bad_spec_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_spec(tmp_path, grid={"num_instance": [1]})
    with pytest.raises(SystemExit) as e:
        cli.main(["sim-search", "--config", str(path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "workbench sim-search: search spec 'cli': grid.num_instance is not a search axis "
        "(did you mean 'num_instances'?) (axes: tensor_parallel_size, pipeline_parallel_size, "
        "num_instances, pd, max_num_batched_tokens, max_num_seqs)"]
    with pytest.raises(SystemExit) as e:
        cli.main(["sim-search", "--config", str(tmp_path / "missing.yaml")])
    assert capsys.readouterr().err.splitlines() == [
        f"workbench sim-search: --config ({str(tmp_path / 'missing.yaml')!r}) is not a file"]
    with pytest.raises(SystemExit) as e:
        cli.main(["sim-search", "--config", str(_write_spec(tmp_path)), "--out", "x.txt"])
    assert capsys.readouterr().err.splitlines() == [
        "workbench sim-search: --out ('x.txt') must end in .json or .csv"]
