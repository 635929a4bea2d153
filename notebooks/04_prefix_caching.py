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
# # 04 · Prefix caching: who gains, and in which cache state
#
# **Question:** how much TTFT does prefix caching save on traffic that shares long prefixes,
# compared with the same lengths without sharing, and how does the answer depend on the cache
# state the measurement starts from (cold engine / warm model / warm prefix cache)? Caching
# on vs off is the one variable; traffic and cache state are the conditions.

# %% tags=["parameters"]
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
num_requests = 12
num_prefix_groups = 2           # shared traffic: request i uses prefix i % groups
prefix_len = 256                # tokens of the shared prefix (16 full blocks at block_size 16)
concurrency = 4                 # closed loop
cache_states = ["cold", "warm-model", "warm-prefix"]
caching = [True, False]         # enable_prefix_caching
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import (
    CACHE_STATES,
    TRACKING,
    Bool,
    Int,
    List,
    Model,
    Str,
    check_params,
)

check_params(
    globals(),
    model=Model(),
    num_requests=Int(min=1),
    num_prefix_groups=Int(min=1),
    prefix_len=Int(min=1),
    concurrency=Int(min=1),
    cache_states=List(Str(choices=CACHE_STATES)),
    caching=List(Bool()),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["hit_rate.*"]

# %%
# %matplotlib inline
from workbench.analysis import bar_compare, latency_ecdf
from workbench.analysis.notebook import publish
from workbench.config.named_models import resolve_model
from workbench.experiments.loops import cache_conditions, prefix_workloads, workload_table
from workbench.models.tokenizer import load_tokenizer

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 1024, "block_size": 16,
                 "max_num_batched_tokens": 512}

# %% [markdown]
# Two workloads with the same length distributions: `shared` puts the requests in a few prefix
# groups, `unique` gives every request its own prefix.

# %%
workloads = prefix_workloads(load_tokenizer(model_path), seed, num_requests, prefix_len,
                             num_prefix_groups)
workload_table(workloads)

# %%
table, requests = cache_conditions(model_path, engine_kwargs, workloads, cache_states, caching,
                                  concurrency)
table

# %%
fig_ttft = bar_compare(table, x="cache_state", y="median_ttft_ms", hue="prefix_caching",
                       col="traffic", title="median TTFT")
fig_ttft

# %%
fig_hits = bar_compare(table, x="cache_state", y="hit_rate", hue="prefix_caching",
                       col="traffic", title="prefix-cache hit rate (tokens)")
fig_hits

# %%
fig_ecdf = latency_ecdf({k: v for k, v in requests.items() if k.startswith("shared")},
                        "ttft_ms", title="TTFT ECDF, shared-prefix traffic")
fig_ecdf

# %%
shared_on = table[(table["traffic"] == "shared") & table["prefix_caching"]]
publish("04_prefix_caching",
        metrics={f"hit_rate.{s}": h
                 for s, h in zip(shared_on["cache_state"], shared_on["hit_rate"], strict=True)},
        figures={"median_ttft": fig_ttft, "hit_rate": fig_hits, "ttft_ecdf": fig_ecdf},
        tables={"conditions": table}, figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - **Hit rate** (cached tokens / looked-up tokens in the measured run): `warm-prefix` replays
#   every request once before measuring, so nearly every full prefix block hits, even for
#   `unique` traffic (its own prefix was seen); `cold` and `warm-model` start the measured run
#   with an empty cache, so only sharing *within* the run hits: high for `shared`, zero for
#   `unique`; with caching off it is 0 everywhere. Only full blocks are cached, and the last
#   prompt token is always recomputed.
# - **TTFT** falls with the hit rate because a hit skips that part of the prefill. The `cold`
#   state also pays one-off engine start-up costs in its first requests, which is why the
#   cache state must be stated with any TTFT number.
# - Not shown: eviction under memory pressure (the pool here is far larger than the working
#   set), and the cost of hashing, which is noise at this scale.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that).
