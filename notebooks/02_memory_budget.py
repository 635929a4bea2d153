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
# # 02 · Memory budget: where the bytes go, and what the KV pool holds
#
# **Question:** of a fixed device budget, how much goes to weights, KV cache, activations and
# headroom, and how many tokens, and how many concurrent `max_model_len` requests, does the KV
# pool hold as `block_size` and `max_model_len` change? Does the engine's own pool sizing
# agree with the arithmetic in `workbench.planning`?

# %% tags=["parameters"]
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
available_mib = 64              # the pretend device budget (the tiny model needs very little)
activation_mib = 8              # reserved for activations
headroom_mib = 4                # kept free
block_size = 16
max_model_len = 1024
block_sizes = [8, 16, 32]       # the grid for capacity and concurrency
max_model_lens = [256, 1024, 2048]
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import BLOCK_SIZES, TRACKING, Float, Int, List, Model, check_params

check_params(
    globals(),
    model=Model(),
    available_mib=Float(min=0, min_open=True),
    activation_mib=Float(min=0),
    headroom_mib=Float(min=0),
    block_size=Int(choices=BLOCK_SIZES),
    max_model_len=Int(min=2),
    block_sizes=List(Int(choices=BLOCK_SIZES)),
    max_model_lens=List(Int(min=2)),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["kv_cache_bytes", "kv_bytes_per_token", "weight_bytes"]

# %%
# %matplotlib inline
import pandas as pd

from workbench import LLM
from workbench.analysis import grid_heatmap, memory_split
from workbench.analysis.notebook import publish
from workbench.analysis.tables import budget_parts, capacity_grid, memory_check
from workbench.config.named_models import resolve_model
from workbench.experiments.loops import engine_capacity
from workbench.planning import memory_budget

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
MiB = 1 << 20

# %% [markdown]
# ## 1. The model's fixed costs, read from a minimal engine
#
# Weight bytes and KV bytes per token (2 x layers x KV heads x head dim x dtype bytes).

# %%
probe = LLM(model_path, dtype="float32", block_size=block_size, max_model_len=max_model_len,
            num_gpu_blocks_override=max_model_len // block_size + 2)
probe_readout = probe.memory_readout()
pd.Series(probe_readout, name="value").to_frame()

# %% [markdown]
# ## 2. The split: calc's arithmetic vs the engine sized from the same KV budget

# %%
budget = memory_budget(available_mib * MiB, probe_readout["weight_bytes"],
                       probe_readout["kv_bytes_per_token"], block_size,
                       activation_bytes=activation_mib * MiB, headroom_bytes=headroom_mib * MiB,
                       max_model_len=max_model_len)
llm = LLM(model_path, dtype="float32", block_size=block_size, max_model_len=max_model_len,
          kv_cache_memory_bytes=budget["kv_cache_bytes"])
memory_check(budget, llm.memory_readout())

# %% [markdown]
# The engine reserves block 0 as the null block, so it reports one usable block (`block_size`
# tokens) fewer than calc's count of every block in the budget.

# %%
fig_split = memory_split(budget_parts(budget, f"{available_mib} MiB budget"),
                         title=f"{available_mib} MiB: weights / KV / activations / headroom")
fig_split

# %% [markdown]
# ## 3. KV token capacity and max concurrency vs block size and max_model_len

# %%
grid = capacity_grid(available_mib * MiB, budget["weight_bytes"], budget["kv_bytes_per_token"],
                     block_sizes, max_model_lens, activation_bytes=activation_mib * MiB,
                     headroom_bytes=headroom_mib * MiB)
grid

# %%
fig_conc = grid_heatmap(grid, "block_size", "max_model_len", "max_concurrency", fmt=".1f",
                        title="max concurrency at max_model_len")
fig_conc

# %% [markdown]
# The engine agrees at every block size (same KV bytes, its own pool sizing):

# %%
engine_check = engine_capacity(model_path, block_sizes, max_model_len, budget["kv_cache_bytes"])
engine_check = engine_check.merge(grid[grid["max_model_len"] == max_model_len], on="block_size")
engine_check

# %%
publish("02_memory_budget",
        metrics={k: v for k, v in budget.items() if isinstance(v, int | float)},
        figures={"memory_split": fig_split, "max_concurrency": fig_conc},
        tables={"capacity_grid": grid, "engine_check": engine_check},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - The **split** is the seed's accounting: with a fixed budget, KV gets what weights,
#   activations and headroom leave; shrinking the weights (quantization) would move bytes into
#   KV capacity one for one.
# - **KV token capacity** hardly depends on `block_size` (only rounding), but **max
#   concurrency** at `max_model_len` halves when `max_model_len` doubles: it counts requests
#   that could each grow to `max_model_len`, a worst case, not what a real mix of lengths
#   achieves.
# - Activations and headroom are set by hand here; on a GPU they come from a profiling pass
#   (peak memory of a forward at `max_num_batched_tokens`), and CUDA graphs add a reserve.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that).
