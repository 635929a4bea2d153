"""Every notebook under notebooks/ executes under papermill with small parameters.

Each run saves its figures to a temp `figures_dir`; the test checks they exist and that the
executed notebook shows its key table. 03 also logs to a temp MLflow store, which 06 then
reads back by parent run id (06 runs a second time with its default: the example template).

Each notebook's source is its jupytext py:percent twin (notebooks/NN_name.py); the .ipynb is
generated from it (`make notebooks`), and `test_every_notebook_matches_its_py_source` fails
when one side was edited alone.

The notebooks that take longest sit in their own files so that the suite's two workers
share them (`--dist loadfile`): 07, 08 and 11 in test_notebooks_variants.py; 09, 10 and 12,
which start routers on fixed ports, in test_notebooks_routers.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import papermill
import pytest
from ipykernel.ipkernel import IPythonKernel

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute(name: str, tmp: Path, **params: Any) -> tuple[nbformat.NotebookNode, Path]:
    """Run notebooks/<name> with cwd notebooks/ (as JupyterLab does); figures into tmp."""
    figs = tmp / f"figs-{name[:2]}"
    out = tmp / name
    papermill.execute_notebook(str(NOTEBOOKS / name), str(out), cwd=str(NOTEBOOKS),
                               parameters={"figures_dir": str(figs), **params},
                               kernel_name="python3", progress_bar=False)
    return nbformat.read(out, as_version=4), figs


def text_of(nb: nbformat.NotebookNode) -> str:
    """Every text output (streams, markdown, plain and HTML reprs) of the executed notebook."""
    parts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            parts.append(o.get("text", ""))
            data = o.get("data", {})
            parts += [data.get(k, "") for k in ("text/plain", "text/markdown", "text/html")]
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def num_images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def pngs(figs: Path) -> set[str]:
    return {p.name for p in figs.glob("*.png") if p.stat().st_size > 0}


def test_every_notebook_is_tested() -> None:
    names = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert {p.stem for p in NOTEBOOKS.glob("*.py")} == {Path(n).stem for n in names}
    assert names == {"01_quickstart.ipynb", "02_memory_budget.ipynb",
                     "03_chunked_prefill_sweep.ipynb", "04_prefix_caching.ipynb",
                     "05_saturation.ipynb", "06_compare_runs.ipynb",
                     "07_speculative_decoding.ipynb", "08_quantization.ipynb",
                     "09_tp_vs_replicas.ipynb", "10_routing.ipynb", "11_kv_offload.ipynb",
                     "12_pd_disaggregation.ipynb", "13_kv_compression.ipynb"}


# --------------------------------------------------------------------------- py <-> ipynb pairs
# what ipykernel reports (scripts/notebook_language_info.py writes it into every notebook)
KERNEL_LANGUAGE_INFO = {"name": "python", "mimetype": "text/x-python",
                        "codemirror_mode": {"name": "ipython", "version": 3},
                        "pygments_lexer": "ipython3", "nbconvert_exporter": "python",
                        "file_extension": ".py", "version": "(this Python)"}


def pair_problems(folder: Path) -> list[str]:
    """Why the .ipynb files of `folder` are not what jupytext makes of their py:percent twins
    (cell types, sources and metadata such as the `parameters` tag, the kernelspec), or carry
    outputs; and every notebook without its twin. Empty when all pairs agree."""
    import jupytext

    problems = []
    sources = {p.stem: p for p in folder.glob("[0-9]*.py")}
    notebooks = {p.stem: p for p in folder.glob("*.ipynb")}
    problems += [f"{stem}.py has no {stem}.ipynb" for stem in sorted(sources.keys() - notebooks)]
    problems += [f"{stem}.ipynb has no {stem}.py" for stem in sorted(notebooks.keys() - sources)]
    for stem in sorted(sources.keys() & notebooks.keys()):
        want = jupytext.read(sources[stem])
        have = nbformat.read(notebooks[stem], as_version=4)
        if have.metadata.get("jupytext", {}).get("formats") != "ipynb,py:percent":
            problems.append(f"{stem}.ipynb is not paired (jupytext formats ipynb,py:percent)")
        if have.metadata.get("kernelspec") != want.metadata.get("kernelspec"):
            problems.append(f"{stem}: the kernelspecs differ")
        info = {k: v for k, v in have.metadata.get("language_info", {}).items() if k != "version"}
        if info != {k: v for k, v in KERNEL_LANGUAGE_INFO.items() if k != "version"}:
            problems.append(f"{stem}: language_info is not ipykernel's (JupyterLab would mark "
                            "it modified on open); run `make notebooks`")
        if len(have.cells) != len(want.cells):
            problems.append(f"{stem}: {len(want.cells)} cells in the .py, "
                            f"{len(have.cells)} in the .ipynb")
        for i, (w, h) in enumerate(zip(want.cells, have.cells, strict=False)):
            for what in ("cell_type", "source", "metadata"):
                if w.get(what) != h.get(what):
                    problems.append(f"{stem}: cell {i} {what} differs (.py {w.get(what)!r:.80}"
                                    f" vs .ipynb {h.get(what)!r:.80})")
            if h.cell_type == "code" and (h.outputs or h.execution_count is not None):
                problems.append(f"{stem}: cell {i} of the .ipynb has outputs")
    return problems


def test_every_notebook_matches_its_py_source() -> None:
    """notebooks/*.ipynb are `jupytext --to ipynb` of notebooks/*.py, without outputs; after
    editing a .py, run `make notebooks`."""
    assert pair_problems(NOTEBOOKS) == []


def test_pair_check_catches_a_side_edited_alone(tmp_path: Path) -> None:
    """A planted mismatch on either side (or a missing twin) is reported."""
    import shutil

    import jupytext

    for suffix in (".py", ".ipynb"):
        shutil.copy(NOTEBOOKS / f"01_quickstart{suffix}", tmp_path)
    py, ipynb = tmp_path / "01_quickstart.py", tmp_path / "01_quickstart.ipynb"
    assert pair_problems(tmp_path) == []
    original_py, original_ipynb = py.read_text(), ipynb.read_text()

    py.write_text(original_py.replace("seed = 0\n", "seed = 1\n", 1))  # the .py alone
    assert any("cell 1 source differs" in p for p in pair_problems(tmp_path))
    py.write_text(original_py)

    nb = nbformat.read(ipynb, as_version=4)  # the .ipynb alone: a markdown edit, a lost tag
    nb.cells[0].source += " (edited)"
    nb.cells[1].metadata.pop("tags")
    nbformat.write(nb, ipynb)
    problems = pair_problems(tmp_path)
    assert any("cell 0 source differs" in p for p in problems)
    assert any("cell 1 metadata differs" in p for p in problems)

    ipynb.write_text(original_ipynb)  # jupytext's bare language_info: modified on open
    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, ipynb)
    assert pair_problems(tmp_path) == [
        "01_quickstart: language_info is not ipykernel's (JupyterLab would mark it modified "
        "on open); run `make notebooks`"]

    ipynb.write_text(original_ipynb)  # an executed copy is not the committed form
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nbformat.write(nb, ipynb)
    assert pair_problems(tmp_path) == ["01_quickstart: cell 1 of the .ipynb has outputs"]

    jupytext.write(jupytext.read(py), ipynb)  # what `make notebooks` writes: in sync again
    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata["language_info"] = dict(IPythonKernel.language_info)
    nbformat.write(nb, ipynb)
    assert pair_problems(tmp_path) == []
    ipynb.unlink()
    assert pair_problems(tmp_path) == ["01_quickstart.py has no 01_quickstart.ipynb"]


def test_01_quickstart_logs_when_given_a_store(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("01_quickstart.ipynb", tmp_path, num_prompts=4, max_tokens=8,
                       num_requests=4, concurrency=2, mlflow_uri=uri, mlflow_experiment="qs")
    text = text_of(nb)
    assert "Serving Benchmark Result" in text and "GuideLLM" in text
    assert "overhead (step - forward)" in text and "overhead_share" in text
    assert pngs(figs) == {"step_trace.png", "ttft_ecdf.png", "step_account.png"}
    assert num_images(nb) == 3
    from workbench.analysis import parent_runs

    runs = parent_runs("qs", uri)
    assert len(runs) == 1 and runs.loc[0, "metrics.completed"] == 4


def test_02_memory_budget(tmp_path: Path) -> None:
    nb, figs = execute("02_memory_budget.ipynb", tmp_path, model="bundled", block_sizes=[8, 16],
                       max_model_lens=[256, 1024])
    text = text_of(nb)
    assert "calc.memory_budget" in text and "engine_kv_token_capacity" in text
    assert pngs(figs) == {"memory_split.png", "max_concurrency.png"}


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """03 run once, logging into a temp store that 06 reads afterwards."""
    tmp = tmp_path_factory.mktemp("chunked")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    nb, figs = execute("03_chunked_prefill_sweep.ipynb", tmp, model="bundled",
                       max_num_batched_tokens_values=[64],
                       num_requests=6,
                       repeats=1, mlflow_uri=uri, mlflow_experiment="nb-test")
    return {"nb": nb, "figs": figs, "uri": uri}


def test_03_chunked_prefill_sweep(chunked: dict[str, Any]) -> None:
    text = text_of(chunked["nb"])
    assert "| value | p95_itl_ms" in text  # the verdict table
    assert "reject" in text or "ADOPT" in text or "undecided" in text
    assert pngs(chunked["figs"]) == {"tradeoff.png"}


def test_04_prefix_caching(tmp_path: Path) -> None:
    nb, figs = execute("04_prefix_caching.ipynb", tmp_path, model="bundled", num_requests=8,
                       prefix_len=128,
                       cache_states=["warm-model", "warm-prefix"])
    assert "hit_rate" in text_of(nb)
    assert pngs(figs) == {"median_ttft.png", "hit_rate.png", "ttft_ecdf.png"}


def test_05_saturation(tmp_path: Path) -> None:
    nb, figs = execute("05_saturation.ipynb", tmp_path, model="bundled", num_requests=6,
                       concurrencies=[1, 2, 4], max_num_seqs=2)
    assert "output_throughput" in text_of(nb)
    assert pngs(figs) == {"saturation.png", "step_trace.png"}


def test_06_compare_runs_runs_the_example_by_default(tmp_path: Path) -> None:
    nb, figs = execute("06_compare_runs.ipynb", tmp_path, values=[2048], repeats=1,
                       num_requests=4)
    text = text_of(nb)
    assert "relative_effect" in text and "noise_low" in text
    assert pngs(figs) == {"compare.png", "ttft_ecdf.png", "itl_ecdf.png"}


def test_06_compare_runs_reads_a_logged_experiment(chunked: dict[str, Any],
                                                   tmp_path: Path) -> None:
    from workbench.analysis import parent_runs

    runs = parent_runs("nb-test", chunked["uri"])
    parent = runs.loc[0, "tags.experiment_parent_run_id"]
    nb, figs = execute("06_compare_runs.ipynb", tmp_path, parent_run_id=parent,
                       mlflow_uri=chunked["uri"], compare_metrics=["p95_itl_ms", "p95_ttft_ms"])
    text = text_of(nb)
    assert f"parent run: {parent}" in text and "relative_effect" in text
    assert pngs(figs) == {"compare.png", "ttft_ecdf.png", "itl_ecdf.png"}


# --------------------------------------------------------------------------- parameters
NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))


def _parameters_cell(nb: nbformat.NotebookNode) -> int:
    return next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))


def _assigned(source: str) -> list[str]:
    """Every name the cell assigns at top level (what a user may pass with -p)."""
    import ast

    names: list[str] = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_papermill_sees_every_parameter(path: Path) -> None:
    """`papermill --help-notebook` lists what `_infer_parameters` finds; a line with a second
    `=` (in its comment, say) used to hide `model` in six notebooks."""
    from papermill.inspection import _infer_parameters
    from papermill.iorw import load_notebook_node

    nb = load_notebook_node(str(path))  # as `papermill --help-notebook` reads it
    source = nb.cells[_parameters_cell(nb)].source
    seen = [p.name for p in _infer_parameters(nb)]
    assert seen == _assigned(source)
    assert len(seen) >= 5


def _check_statements(nb: nbformat.NotebookNode) -> str:
    """The cell after the parameters cell, up to and including its check_params(...) call."""
    import ast

    cell = nb.cells[_parameters_cell(nb) + 1]
    assert cell.cell_type == "code"
    code = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))
    body = ast.parse(code).body
    end = next(i for i, node in enumerate(body) if isinstance(node, ast.Expr)
               and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", "") == "check_params")
    assert all(isinstance(n, ast.ImportFrom) or (  # the check comes first; renamed
        isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)  # parameters are mapped
        and getattr(n.value.func, "id", "") == "renamed_params") for n in body[:end])
    return ast.unparse(body[:end + 1])


class _Wrong:
    def __repr__(self) -> str:
        return "<wrong>"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_every_parameter_is_checked_first(path: Path) -> None:
    """The defaults pass; a value of the wrong type in any one parameter stops the check
    naming that parameter (every parameter has a spec)."""
    from workbench.notebook_params import NotebookParameterError

    nb = nbformat.read(path, as_version=4)
    params = nb.cells[_parameters_cell(nb)].source
    check = _check_statements(nb)
    defaults: dict[str, Any] = {}
    exec(params, defaults)  # noqa: S102 - the notebook's own parameters cell
    exec(check, dict(defaults))  # noqa: S102 - the defaults are valid
    for name in _assigned(params):
        ns = {**defaults, name: _Wrong()}
        with pytest.raises(NotebookParameterError, match=rf"^notebook parameter {name} "
                                                         r"\(<wrong>, a _Wrong\) must be "):
            exec(check, ns)  # noqa: S102


def test_papermill_stops_at_a_bad_parameter_naming_it(tmp_path: Path) -> None:
    """`papermill 05_saturation.ipynb -p max_num_seqs eight`: the cell right after the
    injected parameters fails, naming the parameter, the value and the allowed range."""
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError) as e:
        execute("05_saturation.ipynb", tmp_path, max_num_seqs="eight")
    assert e.value.ename == "NotebookParameterError"
    assert e.value.evalue == ("notebook parameter max_num_seqs ('eight', a str) must be an "
                              "integer >= 1")
    executed = nbformat.read(tmp_path / "05_saturation.ipynb", as_version=4)
    code = [c for c in executed.cells if c.cell_type == "code"]  # papermill adds markdown
    injected = next(i for i, c in enumerate(code)
                    if "injected-parameters" in c.metadata.get("tags", []))
    failed = next(i for i, c in enumerate(code)
                  if any(o.get("output_type") == "error" for o in c.get("outputs", [])))
    assert failed == injected + 1 and code[failed].execution_count == 3


@pytest.mark.parametrize(("spec", "value", "message"), [
    ("Int(min=1)", 0, "an integer >= 1"),
    ("Int(min=1)", 2.0, "an integer >= 1"),
    ("Int(min=1)", True, "an integer >= 1"),
    ("Int(min=1, max=65535)", 70000, "an integer in [1, 65535]"),
    ("Int(choices=(32, 64, 128))", 16, "an integer, one of 32, 64, 128"),
    ("Float(min=0, min_open=True)", 0, "a number > 0"),
    ("Float(min=0)", float("nan"), "a number >= 0"),
    ("Str(choices=('ngram', 'draft_model'))", "ngrma",
     "one of 'ngram', 'draft_model' (did you mean 'ngram'?)"),
    ("Str(nonempty=True)", "", "a non-empty string"),
    ("List(Int(min=1))", [1, 0], "a non-empty list, each an integer >= 1 (item 1, 0, is not "
                                 "an integer >= 1)"),
    ("List(Int(min=1))", 4, "a non-empty list, each an integer >= 1"),
    ("List(min_len=0)", (1,), "a list"),
    ("Bool()", 1, "True or False"),
    ("Dict()", [], "a dict"),
    ("Model()", "dem", "a local model folder or one of bundled, demo, demo-draft, needle "
                       "(did you mean 'demo'?)"),
    ("Fixture()", "long_prefill", "one of balanced-chat, long-decode, long-prefill, "
                                  "long_doc_qa, multi_turn_chat, repetitive, shared-prefix "
                                  "(did you mean 'long-prefill'?)"),
])
def test_parameter_specs(spec: str, value: Any, message: str) -> None:
    from workbench import notebook_params as p

    assert eval(spec, vars(p)).problem(value) == message  # noqa: S307


def test_check_params_lists_every_problem() -> None:
    from workbench.notebook_params import Float, Int, NotebookParameterError, check_params

    check_params({"a": 1, "b": 2}, a=Int(min=1), b=Float())  # fine: an int is a number
    with pytest.raises(NotebookParameterError) as e:
        check_params({"a": "x"}, a=Int(min=1), b=Float())
    assert str(e.value) == ("2 notebook parameters are invalid: a ('x', a str) must be an "
                            "integer >= 1; b is not defined (the parameters cell must assign it)")
