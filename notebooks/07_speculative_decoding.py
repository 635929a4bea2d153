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
# # 07 · Speculative decoding: speed-up vs k, per concurrency
#
# **Question:** on repetitive traffic ("repeat this text"), how much does speculation speed up
# greedy decoding as the number of draft tokens k grows, at each concurrency; does the
# measured speed-up follow the one predicted from forward-pass counts (seed 002:
# output / (output - accepted)); and how does acceptance fall off by draft position? Output
# must stay token-for-token identical to no speculation.
#
# One k per run: sweep it with
# `workbench sweep notebooks/07_speculative_decoding.ipynb -p num_speculative_tokens 0 1 2 3 5 8`
# (each point logs its numbers into its MLflow child run; every point then redraws the curve
# from all points finished so far, so the last one holds the whole sweep).
#
# Each concurrency is one experiment (`experiments/ngram_speculation.yaml` scaled down:
# speculation off as the baseline, `speculative_config` at k as the variable, `runs` repeats
# interleaved, the greedy-identity quality gate), run by the same runner as `workbench run`
# against a `workbench serve` started per run, so the spec-decode counters are the server's
# over exactly the measured requests (`workbench.experiments.studies.speculation`). k = 0 is
# that baseline: it needs no run of its own.

# %% tags=["parameters"]
model = "demo"                  # the trained demo target (workbench/assets/demo-target)
method = "ngram"                # "ngram" (prompt lookup) or "draft_model"
draft_model = "demo-draft"      # the draft model for method "draft_model"
num_speculative_tokens = 5      # k (0: speculation off)
concurrencies = [1, 4]          # engine max_num_seqs, all requests submitted at once
num_requests = 8                # repetitive requests per concurrency (at least 2 x C)
runs = 2                        # timed runs per point (median), after one warm-up
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import TRACKING, Int, List, Model, Str, check_params

check_params(
    globals(),
    model=Model(),
    method=Str(choices=("ngram", "draft_model")),
    draft_model=Model(),
    num_speculative_tokens=Int(min=0, max=32),
    concurrencies=List(Int(min=1)),
    num_requests=Int(min=1),
    runs=Int(min=1),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["speedup_c*", "predicted_speedup_c*"]

# %%
# %matplotlib inline
from IPython.display import Markdown, display

from workbench.analysis.notebook import publish, resolve_tracking_uri
from workbench.analysis.spec import (
    acceptance_by_position,
    reference_frame,
    spec_frame,
    spec_metrics,
    speedup_vs_k,
    sweep_curve,
)
from workbench.experiments.studies.speculation import measure_spec
from workbench.harness.spec_points import table

k = int(num_speculative_tokens)
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
points = measure_spec(model, method, k, concurrencies, num_requests, seed, runs,
                      draft_model=draft_model, uri=uri)
if points:
    display(Markdown(table(points)))
frame = spec_frame(points, k) if k else reference_frame(concurrencies)
assert frame["identical"].all(), "speculation changed the greedy output"
frame

# %%
metrics = spec_metrics(frame)
# a sweep point logs first, then draws every point so far; standalone, this point only
curve = sweep_curve(frame, metrics, mlflow_uri=mlflow_uri,
                    mlflow_parent_run_id=mlflow_parent_run_id,
                    mlflow_experiment=mlflow_experiment)
fig_speedup = speedup_vs_k(curve, title=f"{method} on {model}: speed-up vs k")
fig_speedup

# %%
fig_acceptance = acceptance_by_position(curve[curve["k"] > 0],
                                        title=f"{method}: acceptance by draft position")
fig_acceptance

# %%
publish("07_speculative_decoding", metrics=metrics,
        figures={"speedup_vs_k": fig_speedup, "acceptance_by_position": fig_acceptance},
        tables={"points": frame.drop(columns=["acceptance_by_position"])},
        params={"model": model, "method": method, "num_speculative_tokens": k},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - **Speed-up vs k:** measured output tok/s against the no-speculation run at the same
#   concurrency (solid), and the prediction from forward-pass counts (dashed). The gap is the
#   price of verification: scoring k + 1 positions costs more than one, and a rejected tail is
#   wasted work. It widens with concurrency, where a step is already busy with other requests'
#   tokens (seed 002: 1.91x at C=1, 1.76x at C=16 on a GPU).
# - **Acceptance by position:** the per-position counter over the number of drafts; it can only
#   fall with the position (position i needs every earlier one accepted), and its steps give the
#   accepted-length distribution.
# - Greedy output is asserted identical to no speculation in the first code cell.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that). Here the
# model is the trained demo target (trained on Python's standard
# library), so acceptance is real, but a CPU step is dominated by fixed per-step costs, which
# flatters speculation at low concurrency.
