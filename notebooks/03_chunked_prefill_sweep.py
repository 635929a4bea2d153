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
# # 03 · Chunked-prefill budget: the TTFT vs ITL trade-off
#
# **Question:** on long-prefill traffic, does a smaller per-step token budget
# (`max_num_batched_tokens`) cut p95 ITL of the requests already decoding, and what does it
# cost in TTFT? One variable, a baseline, the same seeded traffic for every value, repeats
# interleaved, a verdict against the baseline's noise band, all logged to MLflow.

# %% tags=["parameters"]
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
max_num_batched_tokens = 512    # the baseline's per-step token budget (SchedulerConfig)
max_num_batched_tokens_values = [64, 2048]  # the values tried against it
num_requests = 12               # long-prefill requests (prompts ~384 tokens, 8..32 out)
rate = 40.0                     # Poisson arrivals, requests/s
repeats = 2                     # runs per value (baseline included), interleaved
seed = 0
experiment = "nb-chunked-prefill-budget"   # MLflow experiment of the sweep
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import (
    TRACKING,
    Float,
    Int,
    List,
    Model,
    Str,
    check_params,
    renamed_params,
)

# the names before the knob kept its engine name (a FutureWarning names the new one)
renamed_params(globals(), baseline_budget="max_num_batched_tokens",
               budgets="max_num_batched_tokens_values")
check_params(
    globals(),
    model=Model(),
    max_num_batched_tokens=Int(min=1),
    max_num_batched_tokens_values=List(Int(min=1)),
    num_requests=Int(min=1),
    rate=Float(min=0, min_open=True),
    repeats=Int(min=1),
    seed=Int(min=0),
    experiment=Str(nonempty=True),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["num_runs"]

# %%
# %matplotlib inline
from IPython.display import Markdown, display

from workbench.analysis import runs_frame, sweep_tradeoff
from workbench.analysis.notebook import ensure_experiment, publish, resolve_tracking_uri
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template

uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
print("MLflow store:", uri)

# %%
template = parse_template({
    "name": experiment,
    "question": "On long-prefill traffic, does a smaller max_num_batched_tokens cut p95 ITL, "
                "and what does it cost in TTFT?",
    "objective": {"metric": "p95_itl_ms", "direction": "minimize"},
    "slo": {"p95_ttft_ms": 5000, "p95_tpot_ms": 1000, "max_error_rate": 0.0},
    "workload": {"fixture": "long-prefill", "seed": seed, "params": {"num_requests": num_requests}},
    "arrivals": {"mode": "poisson", "rate": rate, "seed": seed},
    "target": {"kind": "in-process", "model": model},
    "baseline": {"dtype": "float32", "max_model_len": 1024, "block_size": 16, "max_num_seqs": 32,
                 "max_num_batched_tokens": max_num_batched_tokens, "enable_chunked_prefill": True,
                 "enable_prefix_caching": True},
    "variable": {"name": "max_num_batched_tokens", "values": max_num_batched_tokens_values},
    "repeats": repeats,
    "cache_state": "warm-model",
})
ensure_experiment(template.name, uri)  # artifacts beside the sqlite file, not in notebooks/
result = run_experiment(template, uri=uri)

# %% [markdown]
# The verdict per value (the rule in its first line: an interval of the effect from the repeats;
# better/worse when it excludes 0, undecided when too wide, e.g. with one repeat; adoption also
# needs the SLO and valid runs):

# %%
display(Markdown(result.table))

# %%
runs = runs_frame(experiment, uri, parent_run_id=result.parent_run_id)
runs = runs[runs["status"] == "FINISHED"]
runs[["tags.value", "tags.repeat", "params.max_num_batched_tokens", "metrics.p95_ttft_ms",
      "metrics.p95_itl_ms", "metrics.p95_tpot_ms", "metrics.prefill_step_share",
      "metrics.output_throughput"]]

# %%
fig_tradeoff = sweep_tradeoff(runs, x="max_num_batched_tokens",
                              ys=["p95_ttft_ms", "p95_itl_ms"],
                              title=f"long-prefill, Poisson {rate:g} req/s, {repeats} repeats")
fig_tradeoff

# %%
publish("03_chunked_prefill_sweep", metrics={"num_runs": len(runs)},
        tags={"experiment_parent_run_id": result.parent_run_id, "adopted": str(result.adopted)},
        figures={"tradeoff": fig_tradeoff}, tables={"runs": runs},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figure shows
#
# - **Left / middle:** p95 TTFT and p95 ITL against the budget (median of the repeats; the
#   band is their range). A small budget chunks each long prompt over many steps, so decodes
#   that share those steps wait less per token (ITL down) while the new prompt's first token
#   comes later (TTFT up); a large budget does the opposite.
# - **Right:** the trade-off curve, one point per budget. The adoption rule in the table
#   picks a point only if p95 ITL is "better" (its interval excludes 0) *and* the TTFT/TPOT
#   SLO still holds.
# - Few repeats give wide intervals: "undecided" is the honest answer at 1-2 repeats. Raise
#   `repeats` (and `num_requests`) for a real answer; docs/experiments.md has the power table.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that). On CPU, a
# step's cost grows with its token count (no idle GPU parallelism to
# absorb a bigger chunk), which exaggerates how much a big budget hurts ITL.
