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
# # 11 · A tiered KV cache on multi-turn chat
#
# **Question:** on multi-turn chat whose histories outgrow the device KV pool, what does a
# host-memory KV tier (vLLM's `OffloadingConnector`) change: TTFT per turn, hit rate per
# tier, bytes moved, and the share of engine time spent copying? The host tier on vs off is
# the one variable; traffic, pool size and concurrency are the conditions.
#
# Each turn's prompt is the whole conversation so far plus a new message, so turn t + 1 could
# reuse turn t's KV. With `num_users` sessions sharing a pool smaller than their histories,
# the device prefix cache evicts a history while its user thinks; the host tier keeps a copy
# of every full block and loads it back instead of recomputing it.
#
# The measurement is `experiments/kv_offload_multi_turn.yaml` with this notebook's numbers,
# run by the same runner as `workbench run` (`workbench.experiments.studies.kv_tiers`): the
# host tier off as the baseline, on as the variable, repeats interleaved, validity checks
# and the template's greedy-identity quality gate included.

# %% tags=["parameters"]
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
num_users = 8                   # chat sessions, all started at once (closed loop of num_users)
num_turns = 6                   # turns per session; a turn's prompt holds the whole history
think_time_s = 0.2              # mean pause after an answer before the next turn (exponential)
num_gpu_blocks = 96             # the device KV pool in 16-token blocks (41 at least)
max_num_seqs = 4                # requests running at once
cpu_bytes_to_use = 268435456    # the host tier in bytes (256 MiB)
repeats = 2                     # runs per config, interleaved (median in the table)
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import TRACKING, Float, Int, Model, check_params

check_params(
    globals(),
    model=Model(),
    num_users=Int(min=1),
    num_turns=Int(min=1),
    think_time_s=Float(min=0),
    num_gpu_blocks=Int(min=41),  # one 640-token request needs 40 blocks, plus the null block
    max_num_seqs=Int(min=1),
    cpu_bytes_to_use=Int(min=1),
    repeats=Int(min=1),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["*.p95_ttft_ms", "*.prefix_cache_hit_rate"]

# %%
# %matplotlib inline
from workbench.analysis.kv_tiers import by_turn, tier_metrics, tier_table, turn_table
from workbench.analysis.notebook import publish, resolve_tracking_uri
from workbench.config.named_models import resolve_model
from workbench.experiments.loops import workload_table
from workbench.experiments.studies.kv_tiers import host_tier, measure_tiers
from workbench.harness.workloads import make_workload
from workbench.models.tokenizer import load_tokenizer

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 640, "block_size": 16,
                 "num_gpu_blocks_override": num_gpu_blocks, "max_num_seqs": max_num_seqs,
                 "max_num_batched_tokens": 512}
configs = {"off": None, "host tier": host_tier(cpu_bytes_to_use)}  # kv_transfer_config
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store

# %% [markdown]
# The traffic: `num_users` sessions of `num_turns` turns (`multi_turn_chat`, the shape of
# LMCache's multi-round QA benchmark), one shared 32-token system prompt, a closed loop of
# `num_users` (every session open at once; the next turn goes out `think_time_s` after the
# answer on average).

# %%
traffic = {"num_users": num_users, "num_turns": num_turns, "think_time_s": think_time_s,
           "first_message_len": {"kind": "uniform", "low": 64, "high": 128},
           "message_len": {"kind": "uniform", "low": 16, "high": 48},
           "answer_len": {"kind": "uniform", "low": 16, "high": 32},
           "system_prompt_len": 32, "max_model_len": 640}
workload = make_workload("multi_turn_chat", seed, load_tokenizer(model_path), **traffic)
workload_table({"multi_turn_chat": workload})

# %% [markdown]
# One fresh engine per run, the host tier off and on, repeats interleaved. Per config
# (median over its repeats): TTFT, the device prefix-cache hit rate and the external (host
# tier) hit rate in tokens, tokens loaded from the host tier, MB (10^6 bytes) copied into the
# device cache (load) and out of it (store), copy time over engine time, and preemptions.

# %%
runs, requests = measure_tiers(model, engine_kwargs, traffic, num_users, configs,
                               repeats=repeats, seed=seed, uri=uri)
table = tier_table(runs)
table

# %% [markdown]
# Per turn, over every repeat: TTFT, the prompt tokens each request did not compute when it
# was first scheduled (`cached_tokens`: device prefix cache + host tier), and the share of
# requests that waited for blocks loaded from the host tier (`loaded_share`).

# %%
turns = turn_table(requests)
turns

# %%
fig_ttft = by_turn(requests, "ttft_ms", title="median TTFT by turn")
fig_ttft

# %%
fig_reuse = by_turn(requests, "cached_tokens", title="median reused prompt by turn")
fig_reuse

# %%
publish("11_kv_offload", metrics=tier_metrics(table, turns),
        figures={"ttft_by_turn": fig_ttft, "reuse_by_turn": fig_reuse},
        tables={"tiers": table, "turns": turns, "runs": runs, "requests": requests},
        params={"model": model, "num_users": num_users, "num_turns": num_turns,
                "think_time_s": think_time_s, "num_gpu_blocks_override": num_gpu_blocks,
                "max_num_seqs": max_num_seqs, "cpu_bytes_to_use": cpu_bytes_to_use,
                "repeats": repeats, "seed": seed},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the numbers show
#
# - **Turn 0** has nothing of its own to reuse: only the shared system prompt (2 blocks) can
#   hit, in either config, so it does the same prefill work on both.
# - **Later turns** could reuse the whole previous prompt. With the host tier off, a history
#   evicted from the device pool while its user thought is computed again, and the longer
#   the conversation, the more of it is lost: reused tokens stop growing, TTFT grows with
#   the prompt. With the host tier on, the evicted blocks come back from host memory
#   (`loaded_share`: the requests that waited for such a load), and only the new message
#   (plus the answer, which the synthetic history does not reuse) is prefilled.
# - **Hit rates** are in tokens over the run, each hits / prompt tokens looked up (vLLM's
#   counters): in the device prefix cache, and in the host tier (the external rate). The
#   host tier also brings back a preempted request's blocks, which the run-level numbers
#   count and the per-turn `cached_tokens` (first schedule only) do not.
# - **Bytes and time:** every full block computed is stored once (`kv_store_mb`); a hit
#   loads it (`kv_load_mb`). The transfer time share is the copy time (loads + stores) over
#   the engine's summed step time.
#
# **CPU vs GPU.** Here "device" and "host" are both RAM: a load or a store is a `memcpy`, and
# the transfer time share is small. The TTFT gain is the scheduling effect: fewer prefill
# tokens per turn. On a GPU the same copy crosses PCIe (about 25 GB/s per direction on PCIe
# 4 x16, 50 on PCIe 5) or NVLink-C2C (GH200: 450 GB/s), against an HBM read at 3-5 TB/s, so
# the share grows and offloading wins only where reading a prefix back is cheaper than
# recomputing it; `workbench calc transfer` gives the break-even for a model and a link. How
# the tiers work, their counters, and the disk tier and swap preemption not measured here:
# [docs/kv_offload.md](../docs/kv_offload.md).
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that). Here the
# history holds synthetic answers, not the generated ones (exact token prefixes, the same
# prompts in every config), so a turn reuses its previous prompt, not that prompt plus its
# answer.
