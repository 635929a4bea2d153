"""workbench.analysis.disagg_runs: a logged colocated-vs-disaggregated rate sweep read back
from a throwaway MLflow store laid out as `rate_sweep_run` logs it, and the pure helpers; the
study that builds and runs those templates (`workbench.experiments.studies.pd_disaggregation`,
`st`): shapes, counts, plans, the capacity measurement through the runner."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

from workbench import planning as calc
from workbench.analysis import disagg_runs as dr
from workbench.analysis import pd_calc as pc
from workbench.analysis.disagg import layout_bands, pd_ratio_plot
from workbench.analysis.notebook import raw_template
from workbench.experiments.studies import pd_disaggregation as st
from workbench.experiments.template import parse_template

KV_TOKEN = 6144  # demo model: 2 (K, V) x 6 layers x 4 KV heads x 32 x 4 bytes


def _delta(reads: int, blocks: int, tokens: int, *, labelled: bool = False) -> dict[str, float]:
    """A router /metrics delta of a disaggregated run: the aggregate series, or only the
    per-replica ones (replica 1 the decode side) when `labelled`."""
    counters = {"workbench:kv_transfer_recv_bytes_total": blocks * 16 * KV_TOKEN,
                "workbench:kv_transfer_recv_tokens_total": tokens,
                "workbench:kv_transfer_recv_queries_total": reads,
                "workbench:kv_transfer_recv_time_total": 0.002 * reads,
                "workbench:kv_transfer_send_bytes_total": blocks * 16 * KV_TOKEN,
                "workbench:disagg_prefill_fallbacks_total": 0.0}
    if not labelled:
        return {**counters, "vllm:num_requests_running": 0.0}
    out = {}
    for name, v in counters.items():
        out[name + '{replica="0"}'] = 0.0
        out[name + '{replica="1"}'] = float(v)
    return out


def _point_records(n: int, ttft: float) -> str:
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "success": [True] * n,
                         "ttft_ms": [ttft + i for i in range(n)],
                         "tpot_ms": [5.0 + i for i in range(n)]}).to_csv(index=False)


def _log_sweep(uri: str, rates: list[float], attain: dict[tuple[int, int], list[float]],
               goodputs: dict[tuple[int, int], float]) -> str:
    """A parent with, per (num_prefill, repeat), a rate-sweep child and one point per rate,
    tagged and logged the way rate_sweep_run / runner.run_one do."""
    from workbench.analysis.notebook import ensure_experiment
    from workbench.tracking.mlflow_store import Store

    ensure_experiment("pd", uri)
    store = Store("pd", uri)
    parent = store.create_run("pd-disaggregation")
    for (num_prefill, repeat), curve in attain.items():
        value = "baseline" if num_prefill == 0 else str(num_prefill)
        tags = {"variable": "num_prefill", "value": value, "repeat": str(repeat),
                "baseline_run": parent, "role": "baseline" if num_prefill == 0 else "variant"}
        params = {"num_prefill": num_prefill, "num_workers": 2}
        child = store.create_run("x", parent_id=parent, tags={**tags, "kind": "rate_sweep"})
        store.log_params(child, params)
        g = goodputs[num_prefill, repeat]
        store.log_metrics(child, {"goodput": g, "goodput_per_worker": g / 2,
                                  "goodput_lower_bound": float(g == rates[-1]),
                                  "failed_points": 0.0})
        store.log_validity(child, repeat != 2)
        store.finish(child)
        for i, (rate, a) in enumerate(zip(rates, curve, strict=True)):
            point = store.create_run("p", parent_id=child, tags={
                **tags, "role": "sweep_point", "sweep_run": child, "rate": f"{rate:g}",
                "rate_index": str(i)})
            store.log_params(point, params)
            store.log_metrics(point, {"slo_attainment": a, "completed": 4.0})
            store.log_validity(point, True, other_cpu_share=0.05, max_other_cpu_share=0.25)
            reads = 4 if num_prefill else 0
            delta = (_delta(reads, 3 * reads, 40 * reads, labelled=i == 1) if num_prefill
                     else {"vllm:num_requests_running": 0.0})
            store.log_files(point, {
                "requests.csv": _point_records(4, 100.0 * (1 + num_prefill) + repeat),
                "server_delta.json": json.dumps({"delta": delta, "count_check": None})})
            store.finish(point)
    store.finish(parent)
    return parent


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    uri = f"sqlite:///{tmp_path_factory.mktemp('pd') / 'mlflow.db'}"
    attain = {(0, 0): [1.0, 0.95, 0.5], (1, 0): [1.0, 0.5, 0.25],
              (0, 1): [1.0, 1.0, 0.75], (1, 1): [1.0, 0.75, 0.0],
              (0, 2): [1.0, 1.0, 1.0], (1, 2): [1.0, 0.5, 0.0]}
    goodputs = {(0, 0): 5.0, (1, 0): 3.0, (0, 1): 6.0, (1, 1): 3.5, (0, 2): 8.0, (1, 2): 2.5}
    return uri, _log_sweep(uri, [2.0, 4.0, 8.0], attain, goodputs)


# --------------------------------------------------------------------------- MLflow readers
def test_point_runs_name_layouts_and_keep_every_point(sweep: tuple[str, str]) -> None:
    uri, parent = sweep
    points = dr.point_runs(parent, uri)
    assert list(points.columns) == dr.POINT_COLUMNS and len(points) == 18
    assert points.groupby("layout").size().to_dict() == {"colocated x2": 9, "1P:1D": 9}
    first = points[(points["layout"] == "1P:1D") & (points["repeat"] == 1)]
    assert list(first["rate"]) == [2.0, 4.0, 8.0] and list(first["rate_index"]) == [0, 1, 2]
    assert list(first["slo_attainment"]) == [1.0, 0.75, 0.0]
    assert points["valid"].all() and not points["disturbed"].any()


def test_point_runs_refuses_a_run_without_points(sweep: tuple[str, str]) -> None:
    uri, parent = sweep
    child = dr.goodput_runs(parent, uri).loc[0, "run_id"]
    with pytest.raises(ValueError, match="has no sweep points"):
        dr.point_runs(child, uri)


def test_point_requests_concatenates_the_repeats_at_one_rate(sweep: tuple[str, str]) -> None:
    uri, parent = sweep
    frames = dr.point_requests(parent, uri, rate=4.0)
    assert list(frames) == ["colocated x2", "1P:1D"]
    dis = frames["1P:1D"]
    assert len(dis) == 12 and sorted(set(dis["repeat"])) == [0, 1, 2]
    assert dis.loc[dis["repeat"] == 1, "ttft_ms"].tolist() == [201.0, 202.0, 203.0, 204.0]
    by_index = dr.point_requests(parent, uri, rate_index=1)
    assert by_index["1P:1D"].equals(dis)
    with pytest.raises(ValueError, match=r"swept rates: \[2.0, 4.0, 8.0\]"):
        dr.point_requests(parent, uri, rate=3.0)
    with pytest.raises(ValueError, match="exactly one of rate"):
        dr.point_requests(parent, uri)


def test_goodput_table_bands_over_repeats(sweep: tuple[str, str]) -> None:
    uri, parent = sweep
    runs = dr.goodput_runs(parent, uri)
    assert len(runs) == 6 and list(runs.columns) == dr.GOODPUT_COLUMNS
    assert runs.loc[runs["repeat"] == 2, "valid"].tolist() == [False, False]
    table = dr.goodput_table(runs).set_index("layout")
    assert table.loc["colocated x2", ["goodput", "goodput_min", "goodput_max"]].tolist() == [
        6.0, 5.0, 8.0]
    assert table.loc["1P:1D", ["goodput_per_worker", "per_worker_min", "per_worker_max"]
                     ].tolist() == [1.5, 1.25, 1.75]
    assert table.loc["colocated x2", "lower_bound"]  # repeat 2 passed every rate
    assert not table.loc["1P:1D", "lower_bound"]
    valid = dr.goodput_table(runs, valid_only=True).set_index("layout")
    assert valid.loc["colocated x2", ["repeats", "invalid_repeats", "goodput"]].tolist() == [
        2, 1, 5.5]
    assert not valid.loc["colocated x2", "lower_bound"]


def test_kv_moved_sums_the_decode_side_reads(sweep: tuple[str, str]) -> None:
    uri, parent = sweep
    moved = dr.kv_moved(parent, uri)
    assert len(moved) == 18
    colo = moved[moved["layout"] == "colocated x2"]
    assert (colo["recv_bytes"] == 0).all() and colo["mb_per_request"].isna().all()
    summary = dr.kv_summary(moved).set_index("layout")
    dis = summary.loc["1P:1D"]
    assert dis["kv_reads"] == 36 and dis["requests"] == 36  # 4 reads x 9 points
    assert dis["mb_read"] == pytest.approx(36 * 3 * 16 * KV_TOKEN / 1e6)
    assert dis["bytes_per_token"] == pytest.approx(3 * 16 * KV_TOKEN / 40)
    assert dis["ms_per_read"] == pytest.approx(2.0)
    assert summary.loc["colocated x2", "kv_reads"] == 0


# --------------------------------------------------------------------------- pure helpers
def test_kv_transfer_row_aggregate_or_per_replica_sum() -> None:
    for labelled in (False, True):
        row = dr.kv_transfer_row(_delta(2, 5, 70, labelled=labelled))
        assert row["recv_bytes"] == 5 * 16 * KV_TOKEN and row["recv_queries"] == 2
        assert row["mb_per_request"] == pytest.approx(5 * 16 * KV_TOKEN / 2 / 1e6)
        assert row["bytes_per_token"] == pytest.approx(5 * 16 * KV_TOKEN / 70)
        assert row["ms_per_request"] == pytest.approx(2.0)
    empty = dr.kv_transfer_row({})
    assert empty["recv_bytes"] == 0.0 and empty["mb_per_request"] != empty["mb_per_request"]


def test_layout_name() -> None:
    assert dr.layout_name(0, 2) == "colocated x2"
    assert dr.layout_name(1, 2) == "1P:1D" and dr.layout_name(3, 4) == "3P:1D"
    with pytest.raises(ValueError, match=r"num_prefill \(2\) must be in \[0, num_workers"):
        dr.layout_name(2, 2)


def test_shape_template_reshapes_the_shipped_template() -> None:
    raw = raw_template("", "pd_disaggregation.yaml")
    for shape in dr.SHAPES:
        out = st.shape_template(raw, shape, rates=[1, 2], num_requests=6, repeats=1, seed=3)
        t = parse_template(out)  # still a valid rate-sweep template
        assert t.name == f"pd-disaggregation-{shape}"
        assert t.workload["params"]["input_len"] == dr.SHAPES[shape]["input_len"]
        assert t.workload["params"]["num_requests"] == 6 and t.workload["seed"] == 3
        assert t.rate_sweep is not None and t.rate_sweep.rates == (1.0, 2.0)
        assert t.rate_sweep.seed == 3 and t.repeats == 1 and t.max_repeats is None
        assert t.baseline["num_prefill"] == 0 and t.variable_values == [1]
    assert raw["workload"]["params"]["num_requests"] != 6  # the input is not modified
    assert st.shape_template(raw, "mixed")["max_repeats"] == raw["max_repeats"]  # kept
    assert st.shape_template(raw, "mixed")["workload"] == {
        **raw["workload"], "params": {**raw["workload"]["params"], **dr.SHAPES["mixed"]}}
    with pytest.raises(ValueError, match="shape .'long'. must be one of prefill-heavy"):
        st.shape_template(raw, "long")
    with pytest.raises(ValueError, match="no rate_sweep block"):
        st.shape_template({"workload": {}}, "mixed")


def test_num_requests_per_shape() -> None:
    """One count for every shape (the scalar form) or {shape: count}; a shape the mapping
    leaves out keeps the template's count (48)."""
    raw = raw_template("", "pd_disaggregation.yaml")
    assert raw["workload"]["params"]["num_requests"] == 48
    per_shape = {"decode-heavy": 96, "prefill-heavy": 32}

    def count(shape: str, n: Any) -> int:
        out = st.shape_template(raw, shape, num_requests=n)
        return parse_template(out).workload["params"]["num_requests"]

    assert {s: count(s, per_shape) for s in dr.SHAPES} == {
        "prefill-heavy": 32, "decode-heavy": 96, "mixed": 48}
    assert {s: count(s, 20) for s in dr.SHAPES} == dict.fromkeys(dr.SHAPES, 20)
    assert {s: count(s, None) for s in dr.SHAPES} == dict.fromkeys(dr.SHAPES, 48)
    assert {s: st.shape_num_requests(per_shape, s) for s in dr.SHAPES} == {
        "prefill-heavy": 32, "decode-heavy": 96, "mixed": None}
    assert st.shape_num_requests(7, "mixed") == 7 and st.shape_num_requests(None, "mixed") is None
    with pytest.raises(ValueError, match=r"num_requests has unknown shapes \['decode'\]"):
        st.shape_template(raw, "mixed", num_requests={"decode": 96})
    for bad in (0, 2.0, True, {"mixed": 0}):
        with pytest.raises(ValueError, match="num_requests for shape 'mixed' .* must be an "
                                             "integer >= 1"):
            st.shape_template(raw, "mixed", num_requests=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape .'long'. must be one of"):
        st.shape_num_requests(3, "long")


def test_run_shapes_refuses_a_bad_count_before_any_sweep(tmp_path: Any) -> None:
    raw = raw_template("", "pd_disaggregation.yaml")
    plan = {"mixed": [1.0], "decode-heavy": [1.0]}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ValueError, match="num_requests for shape 'decode-heavy' .0."):
        st.run_shapes(raw, plan, uri, num_requests={"mixed": 4, "decode-heavy": 0})
    with pytest.raises(ValueError, match="unknown shapes"):
        st.run_shapes(raw, plan, uri, num_requests={"mixed-ish": 4})
    assert not (tmp_path / "mlflow.db").exists()  # nothing ran, no store was made


def test_mean_lengths_and_capacity_config() -> None:
    assert dr.mean_lengths("prefill-heavy") == (640.0, 20.0)
    cfg = st.capacity_config("decode-heavy", "demo", batch=4, repeats=1, max_num_seqs=4)
    assert (cfg.input_len, cfg.output_len, cfg.batch, cfg.num_workers) == (40, 192, 4, 2)
    assert cfg.engine == {"max_num_seqs": 4}


def test_calc_vs_measured_and_split_keys() -> None:
    ratio = calc.pd_ratio(2, 100, 11, prefill_tok_s=1000.0, decode_tok_s=50.0)
    # p = 10 req/s, d = 5 req/s; 1:1 -> min(10, 5) = 5; colocated 2 / (0.1 + 0.2) = 6.67
    measured = {"colocated x2": 4.0, "1P:1D": 2.5}
    table = pc.calc_vs_measured(ratio, measured).set_index("layout")
    assert table.loc["1P:1D", "calc_rate"] == pytest.approx(5.0)
    assert table.loc["colocated x2", "calc_rate"] == pytest.approx(2 / 0.3)
    assert table.loc["1P:1D", "measured_over_calc"] == pytest.approx(0.5)
    assert table.loc["1P:1D", "calc_bottleneck"] == "decode"
    assert (table["calc_best_split"] == "1:1").all()
    assert table.loc["1P:1D", "calc_balanced_p_over_m"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="'2P:2D' is neither colocated nor one of"):
        pc.calc_vs_measured(ratio, {"2P:2D": 1.0})
    keys = pc.split_measured(measured)
    assert keys == {"colocated": 4.0, "1:1": 2.5}
    pd_ratio_plot(ratio, measured=keys)  # the plot takes them
    with pytest.raises(ValueError, match="neither colocated nor 'PP:MD'"):
        pc.split_measured({"x": 1.0})


def test_goodput_and_kv_tables_refuse_empty_input() -> None:
    with pytest.raises(ValueError, match="runs is empty"):
        dr.goodput_table(pd.DataFrame(columns=dr.GOODPUT_COLUMNS))
    with pytest.raises(ValueError, match="moved is empty"):
        dr.kv_summary(pd.DataFrame())


def test_the_template_ships_one_variable_at_two_workers() -> None:
    raw: dict[str, Any] = raw_template("", "pd_disaggregation.yaml")
    t = parse_template(raw)
    assert t.variable_name == "num_prefill" and t.variable_values == [1]
    assert t.baseline["num_workers"] == 2 and t.baseline["num_prefill"] == 0
    assert t.rate_sweep is not None and t.rate_sweep.num_workers == 2
    assert t.repeats == 3 and t.target["command"][:2] == ["workbench", "router"]


# --------------------------------------------------------------------------- notebook glue
def test_sweep_plan_and_quick() -> None:
    rates = {"mixed": [6, 12, 24], "decode-heavy": [1.0, 2.0]}
    assert st.sweep_plan(["mixed", "decode-heavy"], rates) == {
        "mixed": [6.0, 12.0, 24.0], "decode-heavy": [1.0, 2.0]}
    assert st.sweep_plan(["mixed", "decode-heavy"], rates, quick=True) == {
        "mixed": [12.0], "decode-heavy": [2.0]}
    with pytest.raises(ValueError, match="no rates for shape 'prefill-heavy'"):
        st.sweep_plan(["prefill-heavy"], rates)
    with pytest.raises(ValueError, match="shapes is empty"):
        st.sweep_plan([], rates)


def test_layout_bands_and_per_shape(sweep: tuple[str, str]) -> None:
    uri, parent = sweep
    bands = layout_bands(dr.point_runs(parent, uri))
    assert bands["colocated x2"] == [(2.0, 1.0, 1.0, 1.0), (4.0, 1.0, 0.95, 1.0),
                                     (8.0, 0.75, 0.5, 1.0)]
    assert bands["1P:1D"][1] == (4.0, 0.5, 0.5, 0.75)
    both = dr.per_shape({"mixed": parent, "decode-heavy": parent}, uri, "goodput")
    assert list(both.columns[:2]) == ["shape", "layout"] and len(both) == 4
    assert list(both["shape"]) == ["mixed", "mixed", "decode-heavy", "decode-heavy"]
    kv = dr.per_shape({"mixed": parent}, uri, "kv")
    assert kv.set_index("layout").loc["1P:1D", "kv_reads"] == 36
    with pytest.raises(ValueError, match="what .'x'. must be one of goodput, kv"):
        dr.per_shape({"mixed": parent}, uri, "x")


def test_capacity_row_from_calc() -> None:
    from types import SimpleNamespace

    cfg = st.capacity_config("mixed", "demo")
    ratio = calc.pd_ratio(2, cfg.input_len, cfg.output_len, 2720.0, {8: 710.0})
    row = pc.capacity_row("mixed", SimpleNamespace(config=cfg, ratio=ratio, valid=True))
    # p = 2720 / 272 = 10 req/s, d = 710 / 71 = 10 req/s: balanced at 1:1
    assert (row["input_len"], row["output_len"]) == (272, 72)
    assert row["prefill_req_s"] == pytest.approx(10.0)
    assert row["decode_req_s"] == pytest.approx(10.0)
    assert row["balanced_p_over_m"] == pytest.approx(1.0)
    assert row["best_split_of_8"] == "4:4" and row["calc_1p1d"] == pytest.approx(10.0)
    assert row["calc_colocated"] == pytest.approx(10.0)


def test_measure_capacity_holds_torch_to_one_thread() -> None:
    import torch

    before = torch.get_num_threads()
    cap = st.measure_capacity("decode-heavy", "bundled", batch=2, repeats=1)
    assert torch.get_num_threads() == before
    assert (cap.config.input_len, cap.config.output_len) == (40, 192)
    assert cap.prefill.median_tok_s > 0 and cap.decode.median_tok_s > 0
    assert cap.ratio.num_workers == 2
