"""Nothing imports the benchmark scripts: `workbench/bench/` is run (`workbench bench <name>`,
`python -m workbench.bench...`), never imported by another module, a notebook or a script.
Measuring code the scripts share lives in `workbench.harness`; notebooks measure through
`workbench.experiments` (its runner and studies). Tests of the scripts themselves may import
them. Imports are read with ast as in tests/test_layers.py: module level, inside functions
and under `if TYPE_CHECKING:` all count; `workbench.cli` naming a script's module in a string
to run it is not an import."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.test_layers import ROOT, Import, all_modules, imports_of, scan

BENCH = "workbench.bench"
FOLDERS = ("notebooks", "scripts")  # py sources outside the packages


def _is_bench(module: str) -> bool:
    return module == BENCH or module.startswith(BENCH + ".")


def bench_importers(imports: list[Import]) -> list[str]:
    """'importer:line -> imported' for every import of workbench.bench from outside it."""
    return sorted(f"{i.importer}:{i.line} -> {i.imported}" for i in imports
                  if _is_bench(i.imported) and not _is_bench(i.importer))


def folder_imports(root: Path = ROOT) -> list[Import]:
    """The workbench/kernels imports of the notebooks' and scripts' py sources."""
    known = set(all_modules(root))
    return [imp for folder in FOLDERS for path in sorted((root / folder).glob("*.py"))
            for imp in imports_of(f"{folder}.{path.stem}", path.read_text(), False, known)]


def test_no_module_imports_the_bench_scripts() -> None:
    found = bench_importers(scan())
    assert not found, "move what these use into workbench.harness (or run the script):\n" + \
        "\n".join(found)


def test_no_notebook_or_script_imports_the_bench_scripts() -> None:
    found = bench_importers(folder_imports())
    assert not found, "\n".join(found)


def test_a_planted_bench_import_is_reported(tmp_path: Path) -> None:
    files = {
        "kernels/__init__.py": "",
        "workbench/__init__.py": "",
        "workbench/harness/__init__.py": "",
        "workbench/harness/rates.py": """
            def rates():
                from workbench.bench.offline.throughput import main  # lazy, still counted
                return main
        """,
        "workbench/bench/__init__.py": "",
        "workbench/bench/offline/__init__.py": "",
        "workbench/bench/offline/throughput.py": "from workbench.harness import rates\n"
                                                  "def main(): ...\n",
        "workbench/bench/offline/spec.py": "from workbench.bench.offline import throughput\n",
        "notebooks/07_spec.py": "import workbench.bench.offline.spec\n",
        "scripts/figures.py": "from workbench.harness.rates import rates\n",
    }
    for rel, src in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    assert bench_importers(scan(tmp_path)) == [
        "workbench.harness.rates:3 -> workbench.bench.offline.throughput"]
    assert bench_importers(folder_imports(tmp_path)) == [
        "notebooks.07_spec:1 -> workbench.bench.offline.spec"]
