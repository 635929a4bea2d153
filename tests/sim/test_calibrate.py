"""The calibrated cost model (workbench/sim/linear_fit.py, calibrated.py, calibrate.py): the fit
recovers known coefficients from synthetic steps (no wall clock), slow outliers are dropped,
step compositions from computed tokens, the profile's round trip and refusals, and one small
real calibration on the bundled checkpoint (structure only, never its times)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workbench.sim.batch import BatchComposition
from workbench.sim.calibrate import (
    ENGINE_DEFAULTS,
    Phase,
    StepLog,
    calibrate_engine,
    main,
    run_phase,
    step_composition,
)
from workbench.sim.calibrate_serving import composition_of
from workbench.sim.calibrated import (
    PROFILE_FORMAT,
    CalibratedCostModel,
    default_profile_path,
    profile_key,
)
from workbench.sim.linear_fit import TERMS, fastest_per_batch, fit_step_times, predict

KNOWN = {"overhead": 2e-3, "token": 5e-5, "prefill_attn_pair": 2e-8, "decode_kv_token": 1e-7,
         "seq": 3e-5, "sampled_row": 4e-4, "token_low": 3e-5, "prefill_seq": 1e-3,
         "draft_token": 2e-4}


def synthetic_steps(n: int, seed: int = 0) -> list[tuple[BatchComposition, float]]:
    """n random batches timed exactly by KNOWN."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        chunk, ctx = int(rng.integers(0, 512)), int(rng.integers(0, 2048))
        decodes = int(rng.integers(0, 64))
        prefills = int(rng.integers(1, 4))
        batch = BatchComposition(
            prefill_tokens=chunk, prefill_attn_pairs=chunk * ctx + chunk * (chunk + 1) // 2,
            decode_tokens=decodes, decode_context_tokens=decodes * int(rng.integers(1, 3000)),
            num_seqs=decodes + prefills, prefill_seqs=prefills,
            sampled_rows=decodes + int(rng.integers(0, 2)),
            draft_tokens=int(rng.integers(0, 16)))
        out.append((batch, predict(KNOWN, batch)))
    return out


def test_fit_recovers_known_coefficients() -> None:
    fit = fit_step_times(synthetic_steps(80), heldout_fraction=0.25, seed=1)
    assert fit.coefficients == pytest.approx(KNOWN, rel=1e-6)
    assert (fit.num_train, fit.num_heldout, fit.num_outliers) == (60, 20, 0)
    assert fit.heldout_median_rel_error == pytest.approx(0.0, abs=1e-9)
    assert fit.heldout_p95_rel_error == pytest.approx(0.0, abs=1e-9)


def test_fit_drops_slow_outliers() -> None:
    steps = synthetic_steps(60)
    # five steps stretched 3x (another process took the core): slower only, never faster
    noisy = [(b, s * 3.0) if i in (3, 11, 19, 27, 35) else (b, s)
             for i, (b, s) in enumerate(steps)]
    fit = fit_step_times(noisy, heldout_fraction=0.0)
    assert fit.num_outliers == 5
    assert fit.coefficients == pytest.approx(KNOWN, rel=1e-6)
    assert fit.heldout_median_rel_error is None


def test_fastest_per_batch() -> None:
    a, b = BatchComposition(decode_tokens=1), BatchComposition(decode_tokens=2)
    assert fastest_per_batch([(a, 3.0), (b, 5.0), (a, 2.0), (b, 7.0)]) == [(a, 2.0), (b, 5.0)]


def test_fit_refusals() -> None:
    with pytest.raises(ValueError, match="needs at least 9 training steps; got 8 of 10"):
        fit_step_times(synthetic_steps(10), heldout_fraction=0.2)
    steps = synthetic_steps(16)
    steps[4] = (steps[4][0], 0.0)
    with pytest.raises(ValueError, match=r"step times must be > 0; steps \[4\] are not"):
        fit_step_times(steps)


def test_step_composition() -> None:
    # a: chunk 3..7 of a 10-token prompt; b: last chunk 8..10 (samples); c: decodes at 20;
    # d: waiting (not scheduled)
    before = {"a": 3, "b": 8, "c": 20, "d": 0}
    after = {"a": 7, "b": 10, "c": 21, "d": 0}
    prompts = {"a": 10, "b": 10, "c": 12, "d": 50}
    assert step_composition(before, after, prompts) == BatchComposition(
        prefill_tokens=6, prefill_attn_pairs=4 * 3 + 10 + 2 * 8 + 3, decode_tokens=1,
        decode_context_tokens=21, num_seqs=3, sampled_rows=2, prefill_seqs=2)


def _profile() -> dict[str, object]:
    return {"format": PROFILE_FORMAT, "source": "calibrated", "key": "m | x",
            "model": {"name": "bundled"}, "coefficients_s": dict(KNOWN)}


def test_profile_round_trip(tmp_path: Path) -> None:
    path = CalibratedCostModel(_profile()).save(tmp_path / "sub" / "p.json")
    model = CalibratedCostModel.load(path)
    batch = BatchComposition(prefill_tokens=10, prefill_attn_pairs=55, num_seqs=1,
                             sampled_rows=1, prefill_seqs=1)
    # 2e-3 + 10 x 5e-5 + 55 x 2e-8 + 3e-5 + 4e-4 + 10 x 3e-5 (token_low) + 1e-3 (prefill_seq)
    assert model.step_time_s(batch) == pytest.approx(4.2311e-3)
    assert sum(model.breakdown(batch).values()) == pytest.approx(4.2311e-3)
    described = model.describe()
    assert (described["source"], described["profile"], described["model"]) == (
        "calibrated", str(path), "bundled")


def test_profile_refusals(tmp_path: Path) -> None:
    bad = {**_profile(), "coefficients_s": {k: v for k, v in KNOWN.items() if k != "seq"}}
    with pytest.raises(ValueError, match="coefficients_s lacks seq " + r"\(terms: overhead, "):
        CalibratedCostModel(bad)
    with pytest.raises(ValueError, match=r"format \('x/1'\) must be 'workbench-sim-profile/3'"):
        CalibratedCostModel({**_profile(), "format": "x/1"})
    negative = _profile()
    negative["coefficients_s"] = {**KNOWN, "token": -1.0}
    with pytest.raises(ValueError, match=r"coefficient token \(-1.0\) must be a number >= 0"):
        CalibratedCostModel(negative)
    (tmp_path / "p.json").write_text("[1]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        CalibratedCostModel.load(tmp_path / "p.json")
    with pytest.raises(ValueError, match="is unreadable"):
        CalibratedCostModel.load(tmp_path / "missing.json")


def test_default_profile_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))
    path = default_profile_path(profile_key("cpu=X", "LlamaForCausalLM; layers=2"), "bundled")
    assert path.parent == tmp_path / "sim_profiles"
    assert path.name.startswith("bundled-") and path.suffix == ".json"
    assert path == default_profile_path(profile_key("cpu=X", "LlamaForCausalLM; layers=2"),
                                        "bundled")
    assert path != default_profile_path(profile_key("cpu=Y", "LlamaForCausalLM; layers=2"),
                                        "bundled")


def test_calibrate_cli_refuses_bad_engine_json() -> None:
    with pytest.raises(ValueError, match="--engine must be a JSON object"):
        main(["--engine", "[1, 2]"])


def test_real_engine_compositions_and_quick_calibration(tmp_path: Path) -> None:
    """The real engine (bundled, budget 256), once: a 300-token prompt runs as chunks 256 +
    44 then a decode; then the quick design once, fitted: the profile's structure (never its
    times)."""
    from workbench.engine.llm import LLM

    with LLM("bundled", **ENGINE_DEFAULTS) as llm:
        log = StepLog(samples=[])
        run_phase(llm.engine, Phase("prefill", (300,), 2), np.random.default_rng(0), log, "t")
        rows = [r.as_dict() for r in list(llm.engine.stats.step_trace)[-3:]]
        model = calibrate_engine(llm.engine, "bundled", ENGINE_DEFAULTS, repeats=1, quick=True)
    expected = [
        BatchComposition(prefill_tokens=256, prefill_attn_pairs=256 * 257 // 2, num_seqs=1,
                         prefill_seqs=1),
        BatchComposition(prefill_tokens=44, prefill_attn_pairs=44 * 256 + 44 * 45 // 2,
                         num_seqs=1, sampled_rows=1, prefill_seqs=1),
        BatchComposition(decode_tokens=1, decode_context_tokens=301, num_seqs=1,
                         sampled_rows=1)]
    assert [b for b, _ in log.samples] == expected
    # the engine's own step rows carry the same compositions (what --serving fits on)
    assert [composition_of(r) for r in rows] == expected
    assert all(s > 0 for _, s in log.samples)
    assert (log.skipped_preempted, log.skipped_mismatch) == (0, 0)

    path = model.save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["format"] == PROFILE_FORMAT and data["source"] == "calibrated"
    assert data["terms"] == list(TERMS) and set(data["coefficients_s"]) == set(TERMS)
    assert data["model"]["name"] == "bundled" and data["model"]["shape"]["hidden_size"] == 64
    assert data["hardware"]["fingerprint"] in data["key"]
    assert data["engine"]["enable_prefix_caching"] is False
    design = data["design"]
    assert design["skipped_preempted"] == 0 and design["skipped_mismatch"] == 0
    assert design["num_steps"] == design["num_distinct_batches"] > 30
    assert data["fit"]["num_heldout"] == design["num_distinct_batches"] // 4
    assert set(data["validity"]) == {"valid", "reasons", "other_cpu_share",
                                     "max_other_cpu_share"}
    assert data["step_columns"][-1] == "seconds"
    assert len(data["steps"]) == design["num_distinct_batches"]
    assert data["steps"][0][:7] == [256, 256 * 257 // 2, 0, 0, 1, 0, 0]  # the first chunk
    assert model.describe()["source"] == "calibrated"
    assert CalibratedCostModel.load(path).coefficients == model.coefficients
