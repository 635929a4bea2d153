"""Names that become folders: a template's `name`, a sweep's experiment, a rerun's.

`results/<name>/<UTC time>/` (results.new_results_dir) and MLflow's artifact folder
(`mlruns/artifacts/<name>`) are built from a name the user chose, so a name that is a path
(`..`, `a/b`, `/tmp/x`) would write outside the results root. Such a name is refused, naming
the field; any other name is made one safe folder by `results.slug` (characters other than
letters, digits, `.`, `_` and `-` become `_`).
"""

from __future__ import annotations


def path_name_problem(field: str, name: object) -> str | None:
    """Why `name` (the value of `field`) cannot name a folder, or None."""
    if not isinstance(name, str) or not name.strip():
        return f"{field} ({name!r}) must be a non-empty string"
    bad = [c for c in ("/", "\\", "\x00") if c in name]
    if bad or set(name.strip()) == {"."}:
        what = f"contains {bad[0]!r}" if bad else "is only dots"
        return (f"{field} ({name!r}) {what}: it names the results folder "
                "(results/<name>/...), so it must be one folder name, not a path; use "
                "letters, digits, '-', '_' and '.', e.g. 'my-experiment'")
    return None


def check_path_name(field: str, name: object) -> str:
    """`name` when it can name a folder (`path_name_problem`), else ValueError."""
    problem = path_name_problem(field, name)
    if problem:
        raise ValueError(problem)
    return str(name)
