"""A template named `..` (or `a/b`, `/tmp/x`) wrote its results outside --results-dir: names
that become folders are refused, naming the field, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.experiments.template_dicts import TINY_BUDGET, changed
from workbench.cli import main as workbench_main
from workbench.experiments.path_names import path_name_problem
from workbench.experiments.results import new_results_dir
from workbench.experiments.template import parse_template

ADVICE = ("it names the results folder (results/<name>/...), so it must be one folder name, "
          "not a path; use letters, digits, '-', '_' and '.', e.g. 'my-experiment'")


@pytest.mark.parametrize(("name", "what"), [
    ("..", "is only dots"), (".", "is only dots"), ("a/b", "contains '/'"),
    ("/tmp/x", "contains '/'"), ("../../etc", "contains '/'"), ("a\\b", "contains '\\\\'")])
def test_a_template_name_that_is_a_path_is_refused(name: str, what: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_template(changed(TINY_BUDGET, name=name))
    assert str(e.value) == f"name ({name!r}) {what}: {ADVICE}"


def test_names_that_are_folders_pass() -> None:
    for name in ("chunked-prefill-budget", "v1.2_test", "my experiment", "..x"):
        assert path_name_problem("name", name) is None
    assert path_name_problem("name", "") == "name ('') must be a non-empty string"


def test_results_dir_refuses_a_path_name(tmp_path: Path) -> None:
    root = tmp_path / "results"
    with pytest.raises(ValueError, match=r"^experiment name \('\.\.'\) is only dots"):
        new_results_dir("..", root)
    assert not root.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    folder = new_results_dir("my experiment", root)
    assert folder.parent == (root / "my_experiment").resolve()


def test_workbench_run_refuses_it_in_one_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(changed(TINY_BUDGET, name="..")))
    results = tmp_path / "inner" / "results"
    with pytest.raises(SystemExit) as e:
        workbench_main(["run", str(path), "--results-dir", str(results)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"name ('..') is only dots: {ADVICE}" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]  # nothing written
