# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Compare runs: baseline vs variants from MLflow
#
# **Question:** for one logged experiment, how does each variant differ from the baseline on
# each metric, does the interval of the difference exclude 0, and what do the latency
# distributions behind the medians look like? Given `parent_run_id` (and `mlflow_uri`), it reads
# that experiment; left empty, it first runs a small version of the example template
# `experiments/chunked_prefill_budget.yaml`.

# %% tags=["parameters"]
parent_run_id = ""              # parent run of an experiment; empty: run the example
template_path = "../experiments/chunked_prefill_budget.yaml"  # relative to notebooks/
values = [128, 2048]            # example run only: variable values (empty: the template ones)
repeats = 2                     # example run only
num_requests = 8                # example run only
compare_metrics = ["p95_itl_ms", "p95_ttft_ms", "p95_tpot_ms", "output_throughput"]
noise = ""                      # "welch" | "spread" | "bootstrap" | "" (as the verdict)
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import TRACKING, Int, List, Str, check_params

check_params(
    globals(),
    parent_run_id=Str(),
    template_path=Str(nonempty=True),
    values=List(min_len=0),
    repeats=Int(min=1),
    num_requests=Int(min=1),
    compare_metrics=List(Str(nonempty=True)),
    noise=Str(choices=("", "welch", "spread", "bootstrap")),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["*.relative_effect"]

# %%
# %matplotlib inline
from IPython.display import Markdown, display

from workbench.analysis import compare_frame, compare_plot, latency_ecdf, request_frames, runs_frame
from workbench.analysis.notebook import (
    ensure_experiment,
    override_template,
    publish,
    resolve_tracking_uri,
)
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import load_template, parse_template

if parent_run_id and not mlflow_uri:
    raise ValueError("parent_run_id needs mlflow_uri: the tracking store that holds it")
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
print("MLflow store:", uri)

# %%
if not parent_run_id:
    raw = override_template(load_template(template_path).raw, repeats=repeats, values=values,
                            workload_params={"num_requests": num_requests},
                            drop=("quality_gate",))
    ensure_experiment(raw["name"], uri)  # artifacts beside the sqlite file, not in notebooks/
    example = run_experiment(parse_template(raw), uri=uri)
    parent_run_id = example.parent_run_id
    display(Markdown(example.table))
print("parent run:", parent_run_id)

# %%
runs = runs_frame(None, uri, parent_run_id=parent_run_id)
shown = [f"metrics.{m}" for m in compare_metrics if f"metrics.{m}" in runs]
runs[["run_name", "status", "tags.value", "tags.repeat", *shown]]

# %% [markdown]
# Baseline vs each variant: medians over the FINISHED repeats, the delta, the interval of the
# difference (`noise_low`, `noise_high`: the verdict's Welch interval, docs/experiments.md),
# and the verdict the adoption rule uses (better / worse / no change / undecided).

# %%
cf = compare_frame(parent_run_id, compare_metrics, uri, noise=noise or None)
cf

# %%
fig_compare = compare_plot(cf)
fig_compare

# %% [markdown]
# The distributions behind the medians (repeat 0 of every value):

# %%
per_value = request_frames(parent_run_id, uri)
fig_ttft = latency_ecdf(per_value, "ttft_ms", title="TTFT by value")
fig_ttft

# %%
fig_itl = latency_ecdf(per_value, "itl_ms", title="ITL gaps by value")
fig_itl

# %%
publish("06_compare_runs", tags={"compared_parent_run_id": parent_run_id},
        metrics={f"{m}.{v}.relative_effect": e
                 for m, v, e in zip(cf["metric"], cf["value"], cf["relative_effect"], strict=True)},
        figures={"compare": fig_compare, "ttft_ecdf": fig_ttft, "itl_ecdf": fig_itl},
        tables={"compare": cf}, figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - **The comparison plot** puts every metric on one scale, % change of the median vs the
#   baseline's; the line through each point is the interval of the difference (the verdict's
#   Welch interval; an older run logged with `noise` is read with its band). Only an
#   interval that excludes 0 is a change; the marker says which way the verdict went.
# - **The ECDFs** show whether a change in a percentile is a shift of the whole distribution
#   or a few tail requests; with a handful of requests per run the tail is a few points.
# - Caveats of this run: one or two repeats give a wide interval, mostly "undecided" (use
#   more repeats, or `max_repeats` in the template), and the example run drops the
#   template's quality gate to stay fast.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that).
