"""`workbench bench --workload trace:FORMAT:PATH`: a trace file from the field replayed by the
bench as a template replays it: the recorded times divided by rate_scale (`--arrivals trace`,
the default for a trace with times) or re-sampled (`--arrivals poisson:R`), the trace options
as --param, the MLflow keys workload.trace.*, and one line for every bad path, format or
option (exit 2, nothing run)."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.test_cli_errors import last_line, run_main
from workbench.bench import cli as bench_cli
from workbench.bench.trace_workload import parse_trace_ref
from workbench.errors import UserError
from workbench.harness.traces.samples import FILES, SAMPLES_DIR

HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
# five rows, one failed (Response tokens 0): four requests of 3 + 2 + 4 + 3 output tokens
ROWS = ("10,ChatGPT,40,3,43,Conversation log\n"
        "10.5,GPT-4,24,0,24,API log\n"
        "11,ChatGPT,60,2,62,Conversation log\n"
        "12,ChatGPT,32,4,36,API log\n"
        "13,GPT-4,48,3,51,Conversation log\n")
BENCH = ["bench", "--target", "inprocess", "--model", "bundled"]


def _burst(tmp_path: Path) -> Path:
    p = tmp_path / "burst.csv"
    p.write_text(HEAD + ROWS)
    return p


def test_the_spelling_is_format_then_path() -> None:
    assert parse_trace_ref("trace:mooncake:/data/a:b.jsonl") == ("mooncake", "/data/a:b.jsonl")
    with pytest.raises(UserError) as e:
        parse_trace_ref("trace:burstgpt")
    assert str(e.value) == ("--workload ('trace:burstgpt') must be trace:FORMAT:PATH with "
                            "FORMAT one of sharegpt, burstgpt, azure, mooncake")
    with pytest.raises(UserError) as e:
        parse_trace_ref("trace:burstgtp:x.csv")
    assert str(e.value) == ("--workload ('trace:burstgtp:x.csv'): the trace format ('burstgtp') "
                            "must be one of sharegpt, burstgpt, azure, mooncake (did you mean "
                            "'burstgpt'?)")


@pytest.mark.parametrize(("extra", "line"), [
    (["--workload", "trace:csv:x.csv"],
     "workbench bench: --workload ('trace:csv:x.csv'): the trace format ('csv') must be one "
     "of sharegpt, burstgpt, azure, mooncake"),
    (["--workload", "trace:azure:/no/such.csv"],
     "workbench bench: --workload ('trace:azure:/no/such.csv'): the trace file "
     "('/no/such.csv') is not a file"),
    (["--workload", "trace:burstgpt:BURST", "--param", "rate_scale=0"],
     "workbench bench: --param: trace param rate_scale (0) must be a finite number > 0 (2.0 = "
     "twice as fast)"),
    (["--workload", "trace:burstgpt:BURST", "--param", "block_size=16"],
     "workbench bench: --param: trace format 'burstgpt' has no param 'block_size' (did you "
     "mean 'vocab_size'?); allowed: rate_scale, max_requests, start_s, duration_s, "
     "max_model_len, vocab_size, model, log_type"),
    (["--workload", "trace:burstgpt:BURST", "--num-requests", "0"],
     "workbench bench: --num-requests (0) must be an integer >= 1 (a trace's max_requests)"),
    (["--workload", f"trace:sharegpt:{SAMPLES_DIR / FILES['sharegpt']}", "--arrivals", "trace"],
     "workbench bench: --arrivals ('trace') replays the workload's recorded times, but 14 of "
     "its 14 requests have none (a ShareGPT trace records no times); choose poisson:RATE, "
     "gamma:RATE:SHAPE, constant:RATE or closed:C"),
])
def test_bad_input_is_one_line_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], line: str) -> None:
    burst = str(_burst(tmp_path))
    code, err = run_main(capsys, *BENCH, *[a.replace("BURST", burst) for a in extra])
    assert code == 2 and "Traceback" not in err
    assert last_line(err) == line


def test_a_bad_row_is_named_by_file_line_field_and_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(HEAD + "1,ChatGPT,abc,3,3,API log\n")
    code, err = run_main(capsys, *BENCH, "--workload", f"trace:burstgpt:{bad}")
    assert code == 2
    assert last_line(err) == (f"workbench bench: {bad}, line 2: Request tokens ('abc') must be "
                              "a token count (an integer >= 0)")


def _requests(folder: Path) -> list[dict[str, str]]:
    with (folder / "requests.csv").open() as f:
        return list(csv.DictReader(f))


def test_recorded_times_scaled_and_logged_to_mlflow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default arrivals of a timed trace are its own: offsets (t - 10 s) / 4; the run's
    MLflow params name the trace (format, path, sha256, options, counts)."""
    burst = _burst(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run.json"
    bench_cli.main(["--target", "inprocess", "--model", "bundled", "--workload",
                    f"trace:burstgpt:{burst}", "--param", "rate_scale=4.0", "--tracking-uri",
                    uri, "--experiment", "traces", "--json", str(out), "--results-dir",
                    str(tmp_path / "r"), "--no-progress", "--max-other-cpu-share", "1"])
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["arrival"]["mode"] == "trace"
    assert doc["metrics"]["completed"] == 4 and doc["metrics"]["total_output_tokens"] == 12
    assert doc["workload"]["params"]["dropped"] == {"no_output": 1}
    (folder,) = (tmp_path / "r" / "traces").iterdir()  # results/<experiment>/<UTC time>/
    rows = _requests(folder)
    assert sorted(float(r["target_arrival_s"]) for r in rows) == [0.0, 0.25, 0.5, 0.75]
    assert json.loads((folder / "runs.json").read_text())[0]["arrivals"] == "trace"
    run_id = printed.split("MLflow run ")[1].split()[0]
    params = MlflowClient(tracking_uri=uri).get_run(run_id).data.params
    trace = {k.removeprefix("workload.trace."): v for k, v in params.items()
             if k.startswith("workload.trace.")}
    assert trace == {
        "format": "burstgpt", "path": str(burst),
        "sha256": hashlib.sha256(burst.read_bytes()).hexdigest(), "rate_scale": "4.0",
        "max_requests": "null", "start_s": "0.0", "duration_s": "null",
        "max_model_len": "null", "vocab_size": "32000", "model": "null", "log_type": "null",
        "records_read": "5", "dropped.no_output": "1", "num_requests": "4"}
    assert params["arrival_mode"] == "trace"


def test_resampled_arrivals_replay_the_same_requests(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--arrivals poisson re-samples the times over the same requests (same checksum as the
    trace's own replay would send); --num-requests is max_requests; a filter option."""
    burst = _burst(tmp_path)
    out = tmp_path / "run.json"
    bench_cli.main(["--target", "inprocess", "--model", "bundled", "--workload",
                    f"trace:burstgpt:{burst}", "--param", "model=ChatGPT", "--num-requests",
                    "2", "--arrivals", "poisson:5", "--seed", "3", "--no-mlflow", "--json",
                    str(out), "--results-dir", str(tmp_path / "r"), "--no-progress",
                    "--max-other-cpu-share", "1"])
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["arrival"]["mode"] == "poisson" and doc["arrival"]["rate"] == 5.0
    assert doc["workload"]["num_requests"] == 2 and doc["workload"]["total_output_tokens"] == 5
    assert doc["metrics"]["completed"] == 2 and doc["metrics"]["total_output_tokens"] == 5
    assert doc["workload"]["params"]["model"] == "ChatGPT"
    assert doc["workload"]["params"]["max_requests"] == 2
