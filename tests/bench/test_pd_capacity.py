"""`workbench bench pd-capacity` on a tiny random checkpoint: the structure of the figures
(tokens and steps per call, exactly), their consistency (tokens/s = tokens / seconds, the
medians fed to calc.pd_ratio unchanged), the CPU-share judgement and one-line refusals. No
figure's speed is checked."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from workbench import cli
from workbench import planning as calc
from workbench.bench.disagg import capacity as pd_capacity
from workbench.bench.disagg.capacity import PDCapacityConfig
from workbench.harness.validity import FixedCpuWatch
from workbench.testing import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_checkpoint(tmp_path_factory.mktemp("pd") / "llama", arch="llama", seed=0))


def test_measure_separates_prefill_and_decode_and_feeds_calc(ckpt: str) -> None:
    config = PDCapacityConfig(model=ckpt, input_len=32, output_len=6, batch=3, num_workers=3,
                              repeats=2, request_rate=5.0)
    r = pd_capacity.measure(config, FixedCpuWatch(0.05))
    # prefill: 3 prompts x 32 tokens in one step; decode: 3 x 5 tokens in 5 decode-only steps
    # (the prefill step of the 8-token prompts emits each request's first token)
    assert (r.prefill.phase, r.prefill.batch, r.prefill.tokens, r.prefill.steps) == (
        "prefill", 3, (96, 96), (1, 1))
    assert (r.decode.phase, r.decode.batch, r.decode.tokens, r.decode.steps) == (
        "decode", 3, (15, 15), (5, 5))
    for f in (r.prefill, r.decode):
        assert f.tok_s == tuple(t / s for t, s in zip(f.tokens, f.seconds, strict=True))
        assert f.median_tok_s == statistics.median(f.tok_s) > 0
    want = calc.pd_ratio(3, 32, 6, r.prefill.median_tok_s, {3: r.decode.median_tok_s},
                         request_rate=5.0)
    assert r.ratio == want
    assert r.ratio.decode_batch == 3 and [s.label for s in r.ratio.splits] == ["1:2", "2:1"]
    assert (r.valid, r.other_cpu_share) == (True, 0.05)
    lines = r.table().splitlines()
    assert lines[0] == ("| phase | batch | tokens per request | median tok/s | min | max | "
                        "runs | steps per run |")
    assert lines[2].startswith("| prefill | 3 | 32 prompt | ") and lines[2].endswith(
        " | 2 | 1 |")
    assert lines[3].startswith("| decode | 3 | 5 decode | ") and lines[3].endswith(" | 2 | 5 |")


def test_trace_readers_pick_their_steps() -> None:
    trace = [{"prefill_tokens": 64, "decode_tokens": 0, "duration_s": 0.5},
             {"prefill_tokens": 16, "decode_tokens": 4, "duration_s": 0.25},
             {"prefill_tokens": 0, "decode_tokens": 4, "duration_s": 0.125},
             {"prefill_tokens": 0, "decode_tokens": 3, "duration_s": 0.125},
             {"prefill_tokens": 0, "decode_tokens": 0, "duration_s": 1.0}]
    assert pd_capacity.prefill_tok_s(trace) == (80, 0.75, 2)
    assert pd_capacity.decode_tok_s(trace) == (7, 0.25, 2)  # mixed steps left out


def test_main_prints_both_tables_writes_json_and_judges_the_cpu(
        ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "pd.json"
    rc = pd_capacity.main(["--model", ckpt, "--input-len", "16", "--output-len", "4",
                           "--batch", "2", "--num-workers", "4", "--repeats", "1",
                           "--json", str(out_json), "--strict"], watch=FixedCpuWatch(0.6))
    assert rc == 2
    out = capsys.readouterr().out
    assert "| phase | batch | tokens per request |" in out
    assert "calc.pd_ratio for 4 workers, input 16, output 4 tokens:" in out
    assert "| P:M | prefill req/s | decode req/s | system req/s | bottleneck |" in out
    assert ("INVALID bench pd-capacity: other processes used 60% of the CPUs (threshold "
            "25%); not used for any result") in out
    doc = json.loads(out_json.read_text())
    assert doc["valid"] is False and doc["other_cpu_share"] == 0.6
    assert [row["split"] for row in doc["splits"]] == ["1:3", "2:2", "3:1"]
    want = calc.pd_ratio(4, 16, 4, doc["prefill_tok_s"], doc["decode_tok_s"])
    assert doc["best_split"] == want.best.label
    assert doc["balanced_ratio"] == pytest.approx(want.balanced_ratio)
    assert doc["prefill"]["tokens"] == [32] and doc["decode"]["tokens"] == [6]


@pytest.mark.parametrize(("kw", "needle"), [
    ({"output_len": 1}, "output_len must be an integer >= 2"),
    ({"num_workers": 1}, "num_workers must be an integer >= 2"),
    ({"batch": 0}, "batch must be an integer >= 1, got 0"),
    ({"repeats": 0}, "repeats must be an integer >= 1, got 0"),
    ({"prefill_batch": 0}, "prefill_batch must be an integer >= 1, got 0"),
    ({"request_rate": -1.0}, "request_rate must be a finite number > 0"),
    ({"max_other_cpu_share": 2.0}, "max_other_cpu_share must be in [0, 1]"),
])
def test_config_refuses_bad_values(kw: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"model": "bundled", "input_len": 8, "output_len": 4,
                               "batch": 2, "num_workers": 2, **kw}
    with pytest.raises(ValueError) as exc:
        PDCapacityConfig(**args)  # type: ignore[arg-type]
    assert needle in str(exc.value)


def test_cli_refusal_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "pd-capacity", "--model", str(tmp_path), "--input-len", "8",
                  "--output-len", "4", "--batch", "2", "--num-workers", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"workbench bench pd-capacity: model ({str(tmp_path)!r}) must be a model "
                   "folder with config.json (or a shipped name: bundled, demo, demo-draft, "
                   "needle)\n")
