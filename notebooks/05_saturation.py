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
# # 05 · Saturation: throughput and latency vs concurrency
#
# **Question:** as closed-loop concurrency grows from 1, where does output throughput stop
# growing, and what happens to TPOT and TTFT past that point? With `max_num_seqs` capping the
# running batch, the knee should sit at `max_num_seqs`: beyond it extra requests only queue.

# %% tags=["parameters"]
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
workload = "balanced-chat"
num_requests = 16               # requests per concurrency level
concurrencies = [1, 2, 4, 8]    # closed-loop levels
max_num_seqs = 4                # the running-batch cap: the expected knee
repeats = 1
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import TRACKING, Fixture, Int, List, Model, check_params

check_params(
    globals(),
    model=Model(),
    workload=Fixture(),
    num_requests=Int(min=1),
    concurrencies=List(Int(min=1)),
    max_num_seqs=Int(min=1),
    repeats=Int(min=1),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["peak_output_throughput", "peak_concurrency"]

# %%
# %matplotlib inline
from workbench.analysis import saturation_curve, step_series
from workbench.analysis.notebook import publish
from workbench.config.named_models import resolve_model
from workbench.experiments.loops import concurrency_levels
from workbench.harness.workloads import make_workload
from workbench.models.tokenizer import load_tokenizer

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": max_num_seqs,
                 "max_num_batched_tokens": 512}
wl = make_workload(workload, seed, load_tokenizer(model_path), num_requests=num_requests)
wl.summary()

# %%
frame, traces = concurrency_levels(model_path, engine_kwargs, wl, concurrencies, repeats)
frame[["concurrency", "repeat", "output_throughput", "request_throughput", "median_ttft_ms",
       "p95_ttft_ms", "p95_tpot_ms", "mean_server_queue_ms", "valid"]]

# %%
fig_sat = saturation_curve(frame, x="concurrency",
                           ys=["output_throughput", "p95_tpot_ms", "p95_ttft_ms"],
                           knee=max_num_seqs, title=f"{workload}, max_num_seqs={max_num_seqs}")
fig_sat

# %% [markdown]
# The step trace at the highest concurrency: `running` is pinned at `max_num_seqs` and the rest
# wait.

# %%
fig_trace = step_series(traces[max(concurrencies)],
                        title=f"concurrency {max(concurrencies)}, max_num_seqs {max_num_seqs}")
fig_trace

# %%
peak = frame.loc[frame["output_throughput"].idxmax()]
publish("05_saturation",
        metrics={"peak_output_throughput": peak["output_throughput"],
                 "peak_concurrency": peak["concurrency"]},
        figures={"saturation": fig_sat, "step_trace": fig_trace}, tables={"levels": frame},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - **Throughput** rises with concurrency while the batch grows (one forward serves more
#   requests) and flattens at `max_num_seqs`: past the knee the batch is full.
# - **TPOT** stays roughly flat past the knee (the running batch no longer grows), while
#   **TTFT** climbs: the extra requests wait in the queue (`mean_server_queue_ms`), which is
#   exactly what a concurrency above `max_num_seqs` buys.
# - On a GPU the throughput curve keeps rising much longer below the knee (a decode step is
#   memory-bound, so a bigger batch is nearly free); on this CPU a step's cost grows with the
#   batch, so the gain per extra request is small and the curve is noisy. One repeat per level
#   gives no noise band; raise `repeats` before reading a knee off a real model.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that).
