"""Every `workbench` verb answers bad input with one line and exit status 2, no traceback;
`--debug` shows the traceback; a bug says it is one (exit 1)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from workbench import cli

ROOT = Path(__file__).resolve().parents[1]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """(exit status, stderr) of `workbench.cli.main(argv)`."""
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    code = e.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


def last_line(err: str) -> str:
    """The error line (MLflow and argparse print their own lines above it)."""
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "line"), [
    (["run", "/no/such.yaml"], "workbench run: template ('/no/such.yaml') is not a file"),
    (["run", "experiments/ngram_speculation.yaml", "--max-other-cpu-share", "1.5"],
     "workbench run: error: --max-other-cpu-share (1.5) must be in [0, 1]"),
    (["sweep", "/no/such.ipynb", "-p", "x", "1"],
     "workbench sweep: notebook ('/no/such.ipynb') is not a file"),
    (["serve", "--model", "/no/such"], "workbench serve: error: model ('/no/such') is not a "
                                       "folder; pass a local Hugging Face folder"),
    (["router", "--model", "bundled", "--num-replicas", "2", "--num-workers", "3"],
     "workbench router: error: "),
    (["calc", "kv", "--layers", "0", "--kv-heads", "8", "--head-dim", "128"],
     "workbench calc kv: num_layers must be an integer >= 1, got 0"),
    (["preflight", "--compare", "/no/such.json"],
     "workbench preflight: No such file or directory: '/no/such.json'"),
    (["demo-engine", "--model", "/no/such"], "workbench demo-engine: model ('/no/such') is not "
                                             "a folder"),
    (["bench", "--target", "inprocess", "--model", "/no/such", "--workload", "balanced-chat"],
     "workbench bench: --model '/no/such' is not a local folder: pass --tokenizer DIR"),
    (["bench", "sched", "--num-requests", "many"],
     "workbench bench sched: error: argument --num-requests: invalid int value: 'many'"),
    (["bench", "offline", "--runs", "x"],
     "workbench bench offline: error: argument --runs: invalid int value: 'x'"),
    (["bench", "spec", "--bogus"], "workbench bench spec: error: unrecognized arguments"),
    (["frobnicate"], "workbench: unknown command 'frobnicate'; commands: run, promote, sweep"),
])
def test_every_verb_refuses_bad_input_in_one_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], line: str) -> None:
    code, err = run_main(capsys, *argv)
    assert code == 2 and "Traceback" not in err
    assert last_line(err).startswith(line), err


def test_promote_of_an_unknown_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(capsys, "promote", "f" * 32, "--out", str(tmp_path / "x.yaml"),
                         "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}")
    assert code == 2 and "Traceback" not in err
    assert last_line(err).startswith(f"workbench promote: Run with id={'f' * 32} not found")


def _template(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load((ROOT / "experiments" / "chunked_prefill_budget.yaml").read_text())
    data.update(changes)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_run_lists_every_problem_of_a_template(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _template(tmp_path, baseline={"dtype": "float32", "max_model_len": 1024,
                                         "max_num_batched_token": 512},
                     variable={"name": "max_num_batched_tokens", "values": [64, 2048]})
    code, err = run_main(capsys, "run", str(path))
    assert code == 2 and "Traceback" not in err
    assert err.splitlines() == [
        f"workbench run: {path}: 2 problems; nothing was run:",
        "  - baseline.max_num_batched_token is not an engine knob (did you mean "
        "'max_num_batched_tokens'?)",
        "  - variant max_num_batched_tokens=64: max_num_batched_tokens (64) must be >= "
        "max_num_seqs (256); raise it or lower max_num_seqs",
    ]


def test_a_yaml_error_names_the_file_and_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nquestion: [unclosed\nbaseline: {}\n")
    code, err = run_main(capsys, "run", str(path))
    assert code == 2
    assert err.startswith(f"workbench run: {path}, line 3 column ")
    assert "not valid YAML" in err and "Traceback" not in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_main(capsys, "--debug", "run", "/no/such.yaml")
    assert code == 2 and "Traceback (most recent call last)" in err
    assert last_line(err) == "workbench run: template ('/no/such.yaml') is not a file"


def test_a_bug_is_reported_as_one(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    def broken(argv: list[str]) -> None:
        raise KeyError("oops")

    monkeypatch.setitem(cli.COMMANDS, "preflight", (cli.COMMANDS["preflight"][0], broken))
    code, err = run_main(capsys, "preflight")
    assert code == 1 and "Traceback" not in err
    assert err.strip() == ("workbench preflight: internal error (a bug, not your input): "
                           "KeyError: 'oops'; rerun with --debug for the traceback and report it")
    code, err = run_main(capsys, "preflight", "--debug")
    assert code == 1 and "Traceback (most recent call last)" in err and "KeyError" in err


def test_help_lists_every_verb_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["--help"])
    out = capsys.readouterr().out
    verbs = out[out.index("verbs:"):out.index("global flag")]
    for name, (line, _) in cli.COMMANDS.items():
        # argparse puts a long verb's help on the next line: the one line follows its name
        words = " ".join(verbs.split()).split(f" {name} ", 1)[1]
        assert words.startswith(line), name
    assert list(cli.BENCH) == ["offline", "sched", "spec", "kv-cache", "gpu-check", "pd-capacity",
                                "pd-push", "client-capacity"]


def test_bench_verb_dispatches_to_its_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, list[str]]] = []
    for name in ("sched", "kv-cache"):
        monkeypatch.setitem(cli.BENCH, name, ("", lambda a, n=name: seen.append((n, a))))
    monkeypatch.setitem(cli.COMMANDS, "bench", ("", lambda a: seen.append(("serving", a))))
    cli.main(["bench", "sched", "--steps", "3"])
    cli.main(["bench", "kv-cache", "--repeats", "1"])
    cli.main(["bench", "--target", "inprocess", "--debug"])
    assert seen == [("sched", ["--steps", "3"]), ("kv-cache", ["--repeats", "1"]),
                    ("serving", ["--target", "inprocess"])]


def test_the_installed_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    """The real process: `python -m workbench.cli run <bad template>`."""
    path = _template(tmp_path, variable={"name": "max_num_seq", "values": [8]})
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"workbench run: {path}: 1 problem; nothing was run:",
        "  - variable.name (max_num_seq) is not an engine knob (did you mean 'max_num_seqs'?)"]


def test_run_exits_1_when_every_baseline_run_failed(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A valid template whose server never starts: every run FAILED, no verdict, exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = _template(
        tmp_path, repeats=1, warmup_requests=0, quality_gate=None,
        workload={"fixture": "balanced-chat", "seed": 0, "params": {"num_requests": 2}},
        target={"kind": "http", "base_url": f"http://127.0.0.1:{port}/v1", "model": "bundled",
                "command": [sys.executable, "-c", "raise SystemExit(3)"],
                "ready_timeout_s": 30},
        baseline={"max_num_seqs": 8}, variable={"name": "max_num_seqs", "values": [4]})
    data = yaml.safe_load(path.read_text())
    data.pop("quality_gate")
    path.write_text(yaml.safe_dump(data))
    code, err = run_main(capsys, "run", str(path), "--tracking-uri",
                         f"sqlite:///{tmp_path / 'm.db'}")
    assert code == 1
    assert last_line(err).startswith(
        "workbench run: every baseline run failed, so there is no verdict; first error: "
        "RuntimeError: server command exited with code 3 before it was ready")
