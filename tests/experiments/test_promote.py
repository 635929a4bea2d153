"""`workbench promote`: what it writes runs as the next baseline, or it refuses clearly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from workbench.errors import TemplateError, UserError
from workbench.experiments.promote import promote_from_mlflow, promoted_template, write_promoted
from workbench.experiments.template import load_template, parse_template
from workbench.tracking.mlflow_store import Store

SPEC = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
        "prompt_lookup_max": 3}
NGRAM: dict[str, Any] = {
    "name": "ngram", "question": "Does n-gram speculation help?",
    "workload": {"fixture": "repetitive", "seed": 0, "params": {"num_requests": 2}},
    "arrivals": {"mode": "closed", "concurrency": 1},
    "target": {"kind": "in-process", "model": "bundled"},
    "baseline": {"dtype": "float32", "max_model_len": 512, "speculative_config": None},
    "variable": {"name": "speculative_config", "values": [SPEC]},
    "repeats": 1,
}


def test_an_unset_knob_comes_back_as_the_engine_default(tmp_path: Path) -> None:
    """The baseline left max_num_seqs unset (256); 8 adopted: the next template tries 256
    and the other value, and it loads like any template."""
    t = parse_template({**NGRAM, "baseline": {"dtype": "float32", "max_model_len": 512},
                        "variable": {"name": "max_num_seqs", "values": [8, 16]}})
    raw = promoted_template(t, 8, "run1")
    assert raw["baseline"]["max_num_seqs"] == 8
    assert raw["variable"] == {"name": "max_num_seqs", "values": [256, 16]}
    out = write_promoted(raw, tmp_path / "next.yaml")
    assert load_template(out).variable_values == [256, 16]


def test_nothing_left_to_try_is_refused_until_the_next_variable_is_named(
        tmp_path: Path) -> None:
    """speculative_config null -> ngram: the old value (null) cannot be a variable value,
    so promote used to write `values: []` (a traceback on the next run)."""
    t = parse_template(NGRAM)
    with pytest.raises(UserError, match=r"no speculative_config value left to try: .* name the "
                                        r"next question with --next-variable NAME --values"):
        promoted_template(t, SPEC, "run1")
    raw = promoted_template(t, SPEC, "run1", next_variable=("max_num_seqs", [4, 16]))
    out = write_promoted(raw, tmp_path / "next.yaml")
    again = load_template(out)
    assert again.baseline["speculative_config"] == SPEC
    assert (again.variable_name, again.variable_values) == ("max_num_seqs", [4, 16])


def test_a_bad_next_variable_writes_nothing(tmp_path: Path) -> None:
    raw = promoted_template(parse_template(NGRAM), SPEC, "run1",
                            next_variable=("max_num_seq", [4]))
    with pytest.raises(TemplateError, match=r"1 problem; nothing was written:\n  - "
                                            r"variable.name \(max_num_seq\) is not an engine "
                                            r"knob \(did you mean 'max_num_seqs'\?\)"):
        write_promoted(raw, tmp_path / "next.yaml")
    assert not (tmp_path / "next.yaml").exists()


def _adopted_parent(uri: str, template: dict[str, Any], adopted: Any) -> str:
    """A parent run as run_experiment leaves it after adopting `adopted` (written by hand)."""
    store = Store("promote-cli", uri)
    run_id = store.create_run("p", tags={"adopted": json.dumps(adopted)})
    store.log_files(run_id, {"template.yaml": yaml.safe_dump(template),
                             "verdicts.json": json.dumps([{"value": adopted, "adopted": True}])})
    store.finish(run_id)
    return run_id


def test_promote_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workbench.cli import main

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = _adopted_parent(uri, NGRAM, SPEC)
    out = tmp_path / "next.yaml"
    with pytest.raises(SystemExit) as e:
        main(["promote", run_id, "--out", str(out), "--tracking-uri", uri])
    assert e.value.code == 2 and not out.exists()
    err = capsys.readouterr().err  # MLflow's own log lines come first
    assert err.strip().splitlines()[-1].startswith(
        "workbench promote: the promoted template would have no speculative_config value left "
        "to try") and "Traceback" not in err
    main(["promote", run_id, "--out", str(out), "--tracking-uri", uri,
          "--next-variable", "max_num_seqs", "--values", "4", "16"])
    assert capsys.readouterr().out.strip() == f"new baseline template: {out}"
    assert load_template(out).variable_values == [4, 16]
    with pytest.raises(SystemExit) as e:
        main(["promote", run_id, "--out", str(out), "--next-variable", "max_num_seqs"])
    assert e.value.code == 2
    assert "--next-variable and --values go together" in capsys.readouterr().err


def test_promote_command_prints_no_download_bars(tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.cli import main

    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = _adopted_parent(uri, NGRAM, SPEC)
    out = tmp_path / "next.yaml"
    capfd.readouterr()
    main(["promote", run_id, "--out", str(out), "--tracking-uri", uri,
          "--next-variable", "max_num_seqs", "--values", "4", "16"])
    printed, err = capfd.readouterr()
    assert printed.strip() == f"new baseline template: {out}"
    assert "Downloading artifacts" not in err and "it/s" not in err


def test_promote_from_mlflow_of_an_unknown_run_is_a_user_error(tmp_path: Path) -> None:
    from workbench.cli import is_user_error

    with pytest.raises(Exception) as e:
        promote_from_mlflow("0" * 32, tmp_path / "x.yaml", f"sqlite:///{tmp_path / 'm.db'}")
    assert is_user_error(e.value)
