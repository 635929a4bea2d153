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
# # 13 · KV compression: the accuracy-vs-memory frontier
#
# **Question:** for each way of making the KV cache smaller (evicting blocks with
# StreamingLLM, H2O, SnapKV or PyramidKV at a token budget; storing it in fewer bits with
# FP8 or KIVI's int8 / int4 / int2), how much KV does a request really hold, how many
# requests fit in one fixed KV budget, what do throughput and TPOT do at that budget, and
# how much of the model's ability to find a passkey in its context survives?
#
# One call measures every point (`workbench.experiments.kv_frontier.run_frontier`): per
# point, the engine's own per-request KV footprint and the needle grid on one engine, and a
# closed-loop run at the fixed `kv_cache_memory_bytes` through the in-process harness (its
# CPU-disturbance watch included) on another. How each column is computed:
# [docs/kv_compression.md](../docs/kv_compression.md#frontier).

# %% tags=["parameters"]
model = "needle"                # the passkey-trained demo model (`make needle-model`)
methods = ["streaming_llm", "h2o", "snapkv", "pyramidkv"]  # eviction methods ([] for none)
budgets = [64, 256]             # budget_tokens per eviction method (KV tokens kept, per layer)
kv_dtypes = ["fp8", "int4"]     # KV dtypes at full length: fp8, int8, int4, int2
kv_cache_memory_bytes = 8388608  # the fixed KV budget (8 MiB) for concurrency and speed
input_len = 256                 # every workload prompt this many tokens
output_len = 32                 # every workload request generates this many tokens
num_requests = 16               # workload requests per point
concurrency = 8                 # closed-loop concurrency (engine max_num_seqs: 16)
needle_lengths = [256, 512]     # needle prompt lengths in tokens
needle_depths = [0.0, 0.5, 1.0]  # where the passkey sits (0 first, 1 last)
cases_per_cell = 1              # passkeys per (length, depth)
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import TRACKING, Float, Int, List, Model, Str, check_params

check_params(
    globals(),
    model=Model(),
    methods=List(Str(choices=("streaming_llm", "h2o", "snapkv", "pyramidkv")), min_len=0),
    budgets=List(Int(min=1)),
    kv_dtypes=List(Str(choices=("fp8", "int8", "int4", "int2")), min_len=0),
    kv_cache_memory_bytes=Int(min=1),
    input_len=Int(min=1),
    output_len=Int(min=1),
    num_requests=Int(min=1),
    concurrency=Int(min=1),
    needle_lengths=List(Int(min=1)),
    needle_depths=List(Float(min=0, max=1)),
    cases_per_cell=Int(min=1),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["*.needle_accuracy", "*.max_concurrency"]

# %%
# %matplotlib inline
from workbench.analysis.notebook import publish
from workbench.experiments.kv_frontier import FrontierSpec, plot_frontier, run_frontier

spec = FrontierSpec(model=model, methods=tuple(methods), budgets=tuple(budgets),
                    kv_dtypes=tuple(kv_dtypes), kv_cache_memory_bytes=kv_cache_memory_bytes,
                    input_len=input_len, output_len=output_len, num_requests=num_requests,
                    concurrency=concurrency, needle_lengths=tuple(needle_lengths),
                    needle_depths=tuple(needle_depths), needle_cases_per_cell=cases_per_cell,
                    seed=seed)
[p.label for p in spec.points()]

# %% [markdown]
# Every point, one after the other (a line each as it finishes). "none" is the full KV
# cache in the model's dtype (float32 here); an eviction point is `method/budget_tokens`.

# %%
res = run_frontier(spec, progress=print)
res.table.set_index("point").T  # one column per point (the table has 25 columns)

# %% [markdown]
# The same table as Markdown, with the needle accuracy by context length and by depth. A
# budget at or above a prompt's length evicts nothing, so the short prompts pass at every
# budget; the frontier shows where each method starts to lose the passkey.

# %%
from IPython.display import Markdown

Markdown(res.markdown())

# %% [markdown]
# ## The frontier
#
# Needle accuracy against the KV a request holds when it finishes (log scale): one line per
# eviction method through its budgets, full KV and the KV dtypes as labelled points. Up and
# to the left is better: the same accuracy from less memory.

# %%
fig_frontier = plot_frontier(res.table)
fig_frontier

# %%
metrics = {f"{row.point}.{name}": float(getattr(row, name))
           for row in res.table.itertuples()
           for name in ("needle_accuracy", "max_concurrency", "effective_tokens_per_gb")}
publish("13_kv_compression", metrics=metrics, figures={"frontier": fig_frontier},
        tables={"frontier": res.table, "needle": res.needle},
        params={"model": model, "methods": methods, "budgets": budgets,
                "kv_dtypes": kv_dtypes, "kv_cache_memory_bytes": kv_cache_memory_bytes,
                "input_len": input_len, "output_len": output_len,
                "num_requests": num_requests, "concurrency": concurrency,
                "needle_lengths": needle_lengths, "needle_depths": needle_depths,
                "cases_per_cell": cases_per_cell, "seed": seed},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the numbers show
#
# - **Memory.** An eviction method holds about `budget_tokens` of KV per request (whole
#   blocks; PyramidKV the *union* of its layers' blocks, so more than its mean budget), so
#   its footprint stops growing with the context; a KV dtype shrinks every token by the same
#   factor (int8 / int4 / int2 also store a scale and a zero point per key channel and
#   block and per value token, and keep a fixed full-precision residual pool that comes off
#   the budget before it is cut into blocks).
# - **Capacity and speed.** `max_concurrency` is the blocks the fixed budget buys over the
#   blocks a decoding request holds; `mean_running` is what the engine really ran. On this
#   CPU a larger batch does not come for free (each decode step costs more), and H2O pays
#   an extra scoring pass over the keys every step, so throughput and TPOT move less than
#   capacity; read them as this machine's, and only from rows the CPU watch did not flag.
# - **Accuracy.** Full KV (and int8) should find the passkey wherever the model can; a
#   budget far below the prompt forgets the middle of it (StreamingLLM keeps only the sinks
#   and the recent window), and the score-based methods keep the needle only if the
#   question's window attends to it.
#
# **What this does not show.** A 6.8M-parameter model on a shared 2-core CPU, tiny grids
# (one passkey per cell by default): the accuracy steps are coarse and the speed numbers are
# CPU numbers. Run `scripts/kv_compression_frontier.py` with more cases per cell on a quiet
# machine for the table in the docs.
