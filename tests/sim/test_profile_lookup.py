"""`profile: auto` (sim/profile_lookup.py): the newest calibrated profile in the profile folder
whose machine fingerprint, model shape and dtype match; undisturbed before disturbed; none is
one error naming what was looked for and the command that writes it. The folder is
$WORKBENCH_SIM_PROFILE_DIR, else $WORKBENCH_CACHE_DIR/sim_profiles. The fingerprint is
injected (no dependence on this machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workbench.config.named_models import resolve_model
from workbench.errors import TemplateError, UserError
from workbench.experiments.validate import check_template
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.calibrated import PROFILE_FORMAT, default_profile_path, profile_dir
from workbench.sim.linear_fit import TERMS
from workbench.sim.model_shapes import model_shape
from workbench.sim.profile_lookup import (
    ProfileQuery,
    find_profile,
    profile_problems,
    query_for,
    resolve_profile,
)
from workbench.sim.target import run_simulated

FP = "cpu=Test CPU; isa=avx2; torch=0.0; threads=2"
BUNDLED = ("this machine (cpu=Test CPU; isa=avx2; torch=0.0; threads=2) and model 'bundled' "
           "(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, "
           "vocab=1024; dtype {dtype})")
REMEDY = ("write one with `workbench calibrate --model bundled{engine}` (or set "
          "WORKBENCH_SIM_PROFILE_DIR to the folder that holds it)")


def _shape(model: str) -> dict[str, Any]:
    return {k: v for k, v in model_shape(resolve_model(model)).as_dict().items() if k != "name"}


def _write(folder: Path, name: str, *, fingerprint: str = FP, model: str = "bundled",
           dtype: str = "float32", device: str = "cpu", created: str = "2026-12-01T00:00:00",
           valid: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    profile = {"format": PROFILE_FORMAT, "source": "calibrated", "key": f"{fingerprint} | x",
               "hardware": {"fingerprint": fingerprint, "cpu": "Test CPU", "device": device},
               "model": {"name": model, "shape": {**_shape(model), "name": model}},
               "engine": {"dtype": dtype}, "coefficients_s": dict.fromkeys(TERMS, 1e-4),
               "validity": {"valid": valid, "reasons": []}, "created": created}
    path = folder / name
    path.write_text(json.dumps(profile))
    return path


def _query(dtype: str = "auto", model: str = "bundled") -> ProfileQuery:
    return query_for({"model": model}, {"dtype": dtype}, fingerprint=FP)


def _error(query: ProfileQuery, folder: Path) -> str:
    with pytest.raises(UserError) as e:
        find_profile(query, folder)
    return str(e.value)


def test_the_newest_match_wins_and_others_are_skipped(tmp_path: Path) -> None:
    _write(tmp_path, "a.json", created="2026-11-01T00:00:00")
    newest = _write(tmp_path, "b.json", created="2026-12-01T00:00:00")
    later = "2026-12-05T00:00:00"
    _write(tmp_path, "c.json", created=later, fingerprint="cpu=Other; isa=avx2")
    _write(tmp_path, "d.json", created=later, model="Llama-3-8B")
    bf16 = _write(tmp_path, "e.json", created=later, dtype="bfloat16")
    disturbed = _write(tmp_path, "f.json", created=later, valid=False)
    (tmp_path / "g.json").write_text("not json")
    (tmp_path / "h.json").write_text('{"format": "other/1"}')
    assert find_profile(_query(), tmp_path) == newest  # float32: CPU's auto dtype
    assert find_profile(_query("float32"), tmp_path) == newest
    assert find_profile(_query("bfloat16"), tmp_path) == bf16
    for p in ("a.json", "b.json"):
        (tmp_path / p).unlink()
    assert find_profile(_query(), tmp_path) == disturbed  # only a disturbed one is left


def test_dtype_auto_is_the_engine_default_of_the_profile_device(tmp_path: Path) -> None:
    _write(tmp_path, "cuda32.json", device="cuda", dtype="float32")
    assert _error(_query(), tmp_path).startswith("target.profile ('auto'): no calibrated")
    cuda = _write(tmp_path, "cuda16.json", device="cuda", dtype="bfloat16")
    assert find_profile(_query(), tmp_path) == cuda


def test_resolve_auto_this_machine_or_a_file(tmp_path: Path) -> None:
    p = _write(tmp_path, "p.json")
    for value in ("auto", "this-machine"):
        target = {"kind": "simulated", "model": "bundled", "profile": value}
        assert resolve_profile(target, {}, fingerprint=FP, directory=tmp_path) == str(p)
    assert resolve_profile({"profile": "x/y.json"}, {}) == "x/y.json"


def test_no_match_is_one_error_naming_the_search_and_the_command(tmp_path: Path) -> None:
    _write(tmp_path, "other.json", fingerprint="cpu=Other")
    (tmp_path / "notes.json").write_text("[]")
    assert _error(_query(), tmp_path) == (
        f"target.profile ('auto'): no calibrated profile in {tmp_path} matches "
        f"{BUNDLED.format(dtype='auto')}; it holds 1 profile(s) of other machines, models or "
        f"dtypes and 1 other .json file(s); {REMEDY.format(engine='')}")
    missing = tmp_path / "none"
    assert _error(_query("bfloat16"), missing) == (
        f"target.profile ('auto'): no calibrated profile in {missing} matches "
        f"{BUNDLED.format(dtype='bfloat16')}; the folder does not exist; "
        + REMEDY.format(engine=" --engine '{\"dtype\": \"bfloat16\"}'"))
    assert _error(_query(model="Llama-3-8B"), missing).endswith(
        "; the folder does not exist; 'Llama-3-8B' is a named shape without weights, which "
        "`workbench calibrate` cannot run: give target.hardware (an analytic GPU profile) or "
        "a model folder")
    with pytest.raises(UserError, match=r"^target.profile \('this-machine'\): no calibrated"):
        resolve_profile({"model": "bundled", "profile": "this-machine"}, {}, fingerprint=FP,
                        directory=missing)


def test_the_profile_folder_is_overridable(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("WORKBENCH_SIM_PROFILE_DIR", raising=False)
    assert profile_dir() == tmp_path / "cache" / "sim_profiles"
    monkeypatch.setenv("WORKBENCH_SIM_PROFILE_DIR", str(tmp_path / "mine"))
    assert profile_dir() == tmp_path / "mine"
    assert default_profile_path("cpu=X | m", "bundled").parent == tmp_path / "mine"


def _sim_template(target: dict[str, Any]) -> dict[str, Any]:
    return {"name": "auto-profile", "question": "does the budget matter on this machine?",
            "objective": {"metric": "median_ttft_ms", "direction": "minimize"},
            "workload": {"fixture": "long-prefill", "seed": 0, "params": {"num_requests": 4}},
            "arrivals": {"mode": "closed", "concurrency": 2}, "target": target,
            "baseline": {"max_model_len": 1024, "max_num_batched_tokens": 512},
            "variable": {"name": "max_num_batched_tokens", "values": [64]}, "repeats": 1}


def test_a_simulated_run_uses_the_match_and_a_template_is_refused_without_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("workbench.platforms.cpu_info.machine_fingerprint", lambda: FP)
    monkeypatch.setenv("WORKBENCH_SIM_PROFILE_DIR", str(tmp_path))
    target = {"kind": "simulated", "model": "bundled", "profile": "auto", "step_noise": 0}
    with pytest.raises(TemplateError) as e:
        check_template(_sim_template(target))
    assert f"  - baseline: target.profile ('auto'): no calibrated profile in {tmp_path} " \
        "matches " in str(e.value)
    assert profile_problems({**target, "profile": "/no/such.json"}, {}) == [
        "target.profile ('/no/such.json') is not a file (a profile JSON that `workbench "
        f"calibrate` wrote, or auto / this-machine: the newest of this machine in {tmp_path})"]
    path = _write(tmp_path, "mine.json")
    check_template(_sim_template(target))  # resolves now: no problem left
    wl = Workload("w", 0, {}, (BenchRequest("r", list(range(40)), 3),))
    run = run_simulated(target, {"max_num_seqs": 4, "max_model_len": 256}, wl,
                        ArrivalSpec(mode="closed", concurrency=1))
    assert run.target["cost_model"]["source"] == "calibrated"
    assert run.target["cost_model"]["profile"] == str(path)
    assert [r.output_tokens for r in run.records] == [3]
