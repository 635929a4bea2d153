"""Every notebook under notebooks/ executes under papermill with small parameters.

Each run saves its figures to a temp `figures_dir`; the test checks they exist and that the
executed notebook shows its key table. 03 also logs to a temp MLflow store, which 06 then
reads back by parent run id (06 runs a second time with its default: the example template).

Each notebook's source is its jupytext py:percent twin (notebooks/NN_name.py); the .ipynb is
generated from it (`make notebooks`), and `test_every_notebook_matches_its_py_source` fails
when one side was edited alone.
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
                     "12_pd_disaggregation.ipynb"}


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
    nb, figs = execute("03_chunked_prefill_sweep.ipynb", tmp, model="bundled", budgets=[64],
                       num_requests=6,
                       repeats=1, mlflow_uri=uri, mlflow_experiment="nb-test")
    return {"nb": nb, "figs": figs, "uri": uri}


def test_03_chunked_prefill_sweep(chunked: dict[str, Any]) -> None:
    text = text_of(chunked["nb"])
    assert "| value | p95_itl_ms" in text  # the verdict table
    assert "reject" in text or "ADOPT" in text
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


def test_07_speculative_sweep_over_k_draws_the_curve_from_every_point(tmp_path: Path) -> None:
    """`workbench sweep -p num_speculative_tokens 0 2` on the bundled model with itself as the
    draft (every draft accepted): the last point reads both points back from MLflow."""
    from workbench.analysis import runs_frame
    from workbench.analysis.spec import sweep_spec_frame
    from workbench.sweep import sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rows = sweep(NOTEBOOKS / "07_speculative_decoding.ipynb", "num_speculative_tokens", [0, 2],
                 fixed={"model": "bundled", "method": "draft_model", "draft_model": "bundled",
                        "concurrencies": [1], "num_requests": 2, "runs": 1,
                        "figures_dir": str(tmp_path / "figs")},
                 experiment="spec-sweep", uri=uri, out_dir=tmp_path, progress=False)
    assert [r["status"] for r in rows] == ["FINISHED", "FINISHED"]
    points = runs_frame("spec-sweep", uri)
    last = points.sort_values("start_time").iloc[-1]["run_id"]
    curve = sweep_spec_frame(uri, last)
    assert list(curve["k"]) == [0, 2] and list(curve["concurrency"]) == [1, 1]
    assert curve.loc[0, "speedup"] == 1.0 and curve.loc[1, "acceptance_rate"] == 1.0
    first, second = curve.loc[1, "acceptance_by_position"]
    # every draft accepted; position 1 only lacks the drafts cut to one token by max_tokens
    assert first == 1.0 and 0.9 < second <= 1.0
    assert curve.loc[1, "predicted_speedup"] > 1.5
    assert pngs(tmp_path / "figs") == {"speedup_vs_k.png", "acceptance_by_position.png"}


def test_08_quantization_side_by_side(tmp_path: Path) -> None:
    """Every variant (FP8 KV included) runs on the demo model; memory, quality and speed land
    side by side and the CPU caveat is stated."""
    nb, figs = execute("08_quantization.ipynb", tmp_path, concurrencies=[1, 4], rounds=1,
                       input_len=16, output_len=8, quality_prompts=2, quality_max_tokens=8,
                       ppl_tokens=256)
    text = text_of(nb)
    for variant in ("full", "int8", "int4", "fp8", "fp8-kv"):
        assert variant in text
    assert "Skipped" not in text  # the engine accepted every variant
    assert "kv_token_capacity" in text and "ppl_increase_pct" in text and "us at 1 tokens" in text
    assert "tok_s_c4" in text and "speed_vs_full_c1" in text
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Read the speed numbers as a CPU's, not a GPU's" in source
    assert pngs(figs) == {"memory.png", "throughput.png", "tpot.png"}


def test_09_tp_vs_replicas(tmp_path: Path) -> None:
    """2 workers as 2 replicas and as one TP=2 replica (the router's /metrics sees 2 and 1
    replicas), one-worker reference, the all-reduce timing; the concurrency-1 pair is skipped
    to save two router starts."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("09_tp_vs_replicas.ipynb", tmp_path, model="bundled", num_requests=6,
                       concurrency=2, latency_requests=0, allreduce_iters=10, port=8193,
                       mlflow_uri=uri, mlflow_experiment="tp-nb")
    text = text_of(nb)
    assert "| value | output_throughput" in text and "floor_ms_per_step" in text
    assert pngs(figs) == {"throughput.png", "tpot_ecdf.png"}
    from workbench.analysis import parent_runs, run_artifact_frame

    run = parent_runs("tp-nb", uri).loc[0]
    layouts = run_artifact_frame(run["run_id"], "09_tp_vs_replicas/layouts.csv", uri)
    assert list(layouts["layout"]) == ["1 worker", "2 replicas (TP=1)", "1 replica, TP=2"]
    assert list(layouts["completed"]) == [6, 6, 6]
    assert list(layouts["replicas_seen"].fillna(-1)) == [-1, 2, 1]
    assert layouts.loc[0, "scaling_efficiency"] == 1.0
    tput = layouts.set_index("layout")["output_throughput"]
    assert run["metrics.replicas_scaling_efficiency"] == pytest.approx(
        tput["2 replicas (TP=1)"] / (2 * tput["1 worker"]))
    assert run["metrics.tp2_scaling_efficiency"] == pytest.approx(
        tput["1 replica, TP=2"] / (2 * tput["1 worker"]))
    assert run["metrics.allreduce_median_us_1_token"] > 0


def test_10_routing_round_robin_vs_prefix_aware(tmp_path: Path) -> None:
    """One router of 2 bundled replicas per policy (the 1-vs-2 scaling runs are skipped to
    save two more router starts): round-robin splits every prefix group (no hit),
    prefix-aware reuses each group's prefix."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("10_routing.ipynb", tmp_path, model="bundled", num_requests=6,
                       num_prefix_groups=3, prefix_len=128, rate=20.0, port=8191,
                       scaling_requests=0, mlflow_uri=uri, mlflow_experiment="routing-nb")
    text = text_of(nb)
    assert "| value | p95_ttft_ms" in text and "prefix_hit_rate" in text
    assert pngs(figs) == {"ttft_ecdf.png", "hit_rate.png"}
    from workbench.analysis import parent_runs

    run = parent_runs("routing-nb", uri).loc[0]
    assert run["metrics.round_robin_prefix_hit_rate"] == 0.0
    # 3 of 6 prompts reuse 128 tokens (2 if the load bound sent one elsewhere): >= 0.25
    assert run["metrics.prefix_aware_prefix_hit_rate"] > 0.2


def test_11_kv_offload_host_tier_vs_off(tmp_path: Path) -> None:
    """4 users x 3 turns on a 41-block pool (the histories need about 64 blocks), 2 running
    at once: off never reads a tier; the host tier brings evicted histories back, and every
    byte it loads is a hit token's KV; a first turn can only reuse the shared system prompt."""
    import json

    from workbench.analysis import parent_runs, run_artifact_frame
    from workbench.named_models import resolve_model

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("11_kv_offload.ipynb", tmp_path, model="demo", num_users=4, num_turns=3,
                       think_time_s=0.05, num_gpu_blocks=41, max_num_seqs=2, repeats=1,
                       mlflow_uri=uri, mlflow_experiment="kv-nb")
    assert "external_prefix_cache_hit_rate" in text_of(nb)
    assert pngs(figs) == {"ttft_by_turn.png", "reuse_by_turn.png"} and num_images(nb) == 2
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "](../docs/kv_offload.md)" in source and "memcpy" in source and "PCIe" in source

    run = parent_runs("kv-nb", uri).loc[0]
    tiers = run_artifact_frame(run["run_id"], "11_kv_offload/tiers.csv", uri)
    assert list(tiers["config"]) == ["off", "host tier"] and list(tiers["repeats"]) == [1, 1]
    off, on = tiers.iloc[0], tiers.iloc[1]
    for col in ("external_prefix_cache_hit_rate", "kv_host_hit_tokens", "kv_load_mb",
                "kv_store_mb", "kv_transfer_time_share"):
        assert off[col] == 0.0, col
    assert off["prefix_cache_hit_rate"] > 0  # the system prompt and the histories kept
    assert on["external_prefix_cache_hit_rate"] > 0 and on["kv_host_hit_tokens"] > 0
    assert on["kv_store_mb"] > 0 and 0 < on["kv_transfer_time_share"] < 1
    cfg = json.loads((Path(resolve_model("demo")) / "config.json").read_text())
    kv_bytes_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] \
        * cfg["head_dim"] * 4  # K and V, float32
    assert round(on["kv_load_mb"] * 1e6) == on["kv_host_hit_tokens"] * kv_bytes_per_token
    assert run["metrics.host_tier.external_prefix_cache_hit_rate"] == \
        on["external_prefix_cache_hit_rate"]

    requests = run_artifact_frame(run["run_id"], "11_kv_offload/requests.csv", uri)
    assert requests.groupby("config")["success"].agg(["size", "all"]).to_dict("index") == {
        "host tier": {"size": 12, "all": True}, "off": {"size": 12, "all": True}}
    assert (requests.loc[requests["config"] == "off", "external_tokens"] == 0).all()
    first = requests[requests["turn"] == 0]
    assert (first["cached_tokens"] <= 32).all() and (first["external_tokens"] == 0).all()
    later = requests[(requests["config"] == "host tier") & (requests["turn"] > 0)]
    assert later["external_tokens"].sum() > 0
    assert (later["external_tokens"] <= later["cached_tokens"]).all()
    turns = run_artifact_frame(run["run_id"], "11_kv_offload/turns.csv", uri)
    assert list(zip(turns["config"], turns["turn"], strict=True)) == [
        ("off", 0), ("off", 1), ("off", 2), ("host tier", 0), ("host tier", 1),
        ("host tier", 2)]


def test_12_pd_disaggregation_quick(tmp_path: Path) -> None:
    """`quick`: one shape at one rate, one repeat: a colocated and a 1P:1D router of the
    bundled model (2 router starts); the decode replica reads every prompt's KV, the
    colocated pair none; calc's rates sit beside the measured goodput."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    nb, figs = execute("12_pd_disaggregation.ipynb", tmp_path, model="bundled", quick=True,
                       shapes=["mixed"], rates_mixed=[2.0, 4.0, 8.0], num_requests_mixed=4,
                       capacity_batch=2, port=8194, mlflow_uri=uri, mlflow_experiment="pd-nb")
    text = text_of(nb)
    assert "measured_over_calc" in text and "balanced_p_over_m" in text
    assert pngs(figs) == {"attainment_mixed.png", "latency_cdf_mixed.png",
                          "pd_ratio_mixed.png"}
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "memcpy over loopback" in source and "2 cores" in source
    from workbench.analysis import parent_runs, run_artifact_frame

    run = parent_runs("pd-nb", uri).loc[0]
    assert run["params.num_requests_mixed"] == 4  # only the swept shape's count
    assert "params.num_requests_decode_heavy" not in run
    kv = run_artifact_frame(run["run_id"], "12_pd_disaggregation/kv.csv", uri).set_index(
        "layout")
    assert kv.loc["colocated x2", "kv_reads"] == 0 and kv.loc["1P:1D", "kv_reads"] == 4
    assert kv.loc["1P:1D", "failed_reads"] == 0 and kv.loc["1P:1D", "mb_read"] > 0
    goodput = run_artifact_frame(run["run_id"], "12_pd_disaggregation/goodput.csv", uri)
    assert list(goodput["layout"]) == ["colocated x2", "1P:1D"]
    assert list(goodput["repeats"]) == [1, 1]
    points = run_artifact_frame(run["run_id"], "12_pd_disaggregation/points.csv", uri)
    assert list(points["rate"]) == [4.0, 4.0] and (points["status"] == "FINISHED").all()
    assert (points["completed"] == 4).all()  # num_requests_mixed requests per point


def test_12_defaults_queue_decode_heavy_past_one_batch() -> None:
    """Notebook 12's defaults: 32 requests per point on prefill-heavy and mixed traffic, 96
    (three times the template's max_num_seqs) on decode-heavy, whose rates are the ones the
    docs' figures come from; the templates the notebook runs carry those counts."""
    from workbench.analysis import disagg_runs as dr
    from workbench.analysis.notebook import raw_template

    nb = nbformat.read(NOTEBOOKS / "12_pd_disaggregation.ipynb", as_version=4)
    defaults: dict[str, Any] = {}
    exec(nb.cells[_parameters_cell(nb)].source, defaults)  # noqa: S102 - its parameters cell
    counts = {"prefill-heavy": defaults["num_requests_prefill_heavy"],
              "decode-heavy": defaults["num_requests_decode_heavy"],
              "mixed": defaults["num_requests_mixed"]}
    assert counts == {"prefill-heavy": 32, "decode-heavy": 96, "mixed": 32}
    assert defaults["rates_decode_heavy"] == [6.0, 12.0, 18.0]
    raw = raw_template("", "pd_disaggregation.yaml")
    assert counts["decode-heavy"] == 3 * raw["baseline"]["max_num_seqs"]
    shaped = {shape: dr.shape_template(raw, shape, num_requests=counts) for shape in dr.SHAPES}
    assert {s: t["workload"]["params"]["num_requests"] for s, t in shaped.items()} == counts


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
    assert all(isinstance(n, ast.ImportFrom) for n in body[:end])  # the check comes first
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
    ("Model()", "dem", "a local model folder or one of bundled, demo, demo-draft "
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
