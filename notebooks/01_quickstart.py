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
# # 01 · Quickstart: one engine, one measured run
#
# **Question:** what does the engine do with a handful of prompts, step by step, and what does
# one measured harness run report (vLLM's benchmark metrics, and how other tools would define
# ITL and TPOT for the very same timestamps)?

# %% tags=["parameters"]
model = "demo"                  # "demo": a small Llama trained on Python's stdlib; "bundled"
num_prompts = 8                 # prompts for LLM.generate
max_tokens = 32                 # tokens generated per prompt
workload = "balanced-chat"      # harness fixture: balanced-chat, long-prefill, long-decode, ...
num_requests = 8                # requests in the measured run
concurrency = 4                 # closed loop: requests in flight
max_num_batched_tokens = 256    # the per-step token budget (vLLM: at least max_num_seqs)
max_num_seqs = 256              # the running-batch cap (the engine's default)
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import TRACKING, Fixture, Int, Model, check_params

check_params(
    globals(),
    model=Model(),
    num_prompts=Int(min=1),
    max_tokens=Int(min=1),
    workload=Fixture(),
    num_requests=Int(min=1),
    concurrency=Int(min=1),
    max_num_seqs=Int(min=1),
    max_num_batched_tokens=Int(min=1, at_least="max_num_seqs",
                               why="vLLM refuses a step budget below max_num_seqs; lower "
                                   "max_num_seqs too (--set max_num_seqs=N)"),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["output_throughput", "p95_ttft_ms", "p95_itl_ms", "p95_tpot_ms"]

# %%
# %matplotlib inline
import pandas as pd
from IPython.display import Markdown, display

from workbench import LLM, SamplingParams
from workbench.analysis import latency_ecdf, step_series
from workbench.analysis.notebook import publish
from workbench.analysis.step_account import (
    account_beside_latency,
    step_account_bars,
    step_account_table,
)
from workbench.analysis.tables import generation_frame
from workbench.config.named_models import resolve_model
from workbench.demo import make_prompts
from workbench.experiments.loops import measure_in_process
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import records_frame, summary_table
from workbench.harness.peer_metrics import peer_definitions
from workbench.harness.workloads import make_workload

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": max_num_seqs,
                 "max_num_batched_tokens": max_num_batched_tokens}

# %% [markdown]
# ## 1. Generate with the engine
#
# Greedy decoding; each output carries the engine's per-request timestamps.

# %%
llm = LLM(model_path, seed=seed, **engine_kwargs)
outs = llm.generate(make_prompts(num_prompts, seed),
                    SamplingParams(temperature=0.0, max_tokens=max_tokens))
generation_frame(outs)

# %% [markdown]
# Engine counters and gauges under vLLM's metric names:

# %%
pd.Series(llm.stats(), name="value").to_frame()

# %% [markdown]
# The step trace: one row per engine step (prefill and decode tokens in the step's budget, running
# and waiting requests, KV usage).

# %%
trace = pd.DataFrame(llm.step_trace())
fig_steps = step_series(trace, title=f"LLM.generate: {num_prompts} prompts, budget "
                                     f"{max_num_batched_tokens} tokens/step")
fig_steps

# %% [markdown]
# ## 2. One measured harness run
#
# The same engine behind the load generator: a seeded fixture, a closed loop, warm-model cache state
# (the default).

# %%
wl = make_workload(workload, seed, llm.get_tokenizer(), num_requests=num_requests)
result = measure_in_process(model_path, engine_kwargs, wl,
                            ArrivalSpec(mode="closed", concurrency=concurrency))
metrics = result.metrics()
requests = records_frame(result.records)
print(f"workload {wl.name} checksum {wl.checksum[:12]}, valid run: {result.validity.valid}")
display(Markdown(summary_table(metrics)))

# %% [markdown]
# Four tools, four definitions of ITL and TPOT, the same client timestamps:

# %%
peer_definitions(result.records)

# %% [markdown]
# Where each engine step of that run spent its time (the step's overhead account,
# `docs/step_account.md`): the model forward, and everything around it (scheduling, input
# preparation, logits + sampling, the scheduler's update and bookkeeping, the rest), beside the
# run's TTFT and TPOT; in the plot, each step's bar above the blue (the forward) is its overhead,
# and the lower panel's bar height is that step's overhead share. **How to read it:** when the
# overhead (everything but the forward) dominates, an experiment on this setup measures Python
# and dispatch overhead rather than the technique it varies: a faster model would barely move
# TTFT or TPOT.

# %%
display(account_beside_latency(result.step_trace, metrics))
step_account_table(result.step_trace).round({"ms_per_step": 3, "share": 3})

# %%
fig_account = step_account_bars(result.step_trace)
fig_account

# %%
fig_ttft = latency_ecdf({f"{workload}, concurrency {concurrency}": requests}, "ttft_ms")
fig_ttft

# %%
publish("01_quickstart", metrics=metrics, params=engine_kwargs,
        figures={"step_trace": fig_steps, "ttft_ecdf": fig_ttft, "step_account": fig_account},
        tables={"requests": requests},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - The **step trace** shows continuous batching: the first steps are prefill-heavy (prompts
#   chunked into the per-step token budget, `max_num_batched_tokens`), then decode steps carry
#   one token per running request until requests finish and `running` falls.
# - The **summary table** is vLLM's `vllm bench serve` result for this run; the **peer table**
#   shows why an ITL quoted from GuideLLM or LLMPerf is not comparable with vLLM's without
#   converting definitions (TTFT included or not, per-request vs pooled, token-weighted).
# - The **step account** splits every step into the forward and its overheads; on this tiny
#   model and CPU a large overhead share says the per-step Python, not the model, sets the pace.
# - The **TTFT ECDF** is the distribution behind the percentiles; with a few requests its
#   tail is a handful of points.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that).
