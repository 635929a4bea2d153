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
# # 08 · Quantization: where the bytes go, what it costs in quality, and speed on CPU
#
# **Question:** under one fixed memory budget, how do full precision, int8 weights (W8A16),
# int4 weights (W4A16), FP8 weights and activations (W8A8) and an FP8 KV cache compare on the
# same traffic at concurrency 1 and 32: how many bytes move from weights to KV capacity
# (`llm.memory_readout()`), what happens to output throughput and TPOT, and does each variant
# pass the quality gate (`workbench.experiments.quality`: held-out perplexity, KL and top-1
# agreement of next-token distributions, greedy agreement with the full-precision model)?
#
# **Read the speed numbers as a CPU's, not a GPU's.** On a GPU, decode at small batch is
# memory-bound, so fewer weight bytes per step make int8/int4 *faster*, and FP8 W8A8 runs on
# FP8 tensor cores (Hopper, `torch._scaled_mm`). On this CPU there is no such hardware: every
# matmul first dequantizes its weights (extra work, not fewer bytes), FP8 is emulated exactly in
# fp32, and attention dequantizes every FP8 KV block it reads. The quantized variants are
# expected to be *slower* here; section 3 measures by how much, down to one linear layer.
#
# Each variant changes one knob against full precision, so they are measured as experiments
# (`experiments/quantization.yaml` and `kv_cache_dtype.yaml` scaled down, one per concurrency:
# the weight formats, then the FP8 KV cache), by the same runner as `workbench run`, with its
# validity checks and its quality gate (`workbench.experiments.studies.quantization`).

# %% tags=["parameters"]
model = "demo"                  # the trained demo target (bundled: a random tiny Llama)
variants = ["full", "int8", "int4", "fp8", "fp8-kv"]  # keys of studies.quantization.VARIANTS
int4_group_size = 128           # quantization_group_size of int4: 32, 64 or 128
concurrencies = [1, 32]         # closed-loop concurrency (engine max_num_seqs: the largest)
rounds = 2                      # requests per concurrency: max(4, rounds x C)
input_len = 64                  # every prompt this many tokens (same traffic for all)
output_len = 32                 # every request generates this many tokens
memory_budget_mib = 96          # whole-process budget: weights + activation peak + KV
quality_prompts = 8             # golden prompts for greedy agreement and KL
quality_max_tokens = 32         # greedy tokens per golden prompt
ppl_tokens = 4096               # held-out stdlib tokens scored for perplexity
gate = {"min_token_agreement": 0.5, "max_ppl_increase_pct": 1.0, "max_mean_kl": 0.01,
        "min_top1_agreement": 0.95}    # the quality gate (as in experiments/quantization.yaml)
seed = 0
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks"  # the experiment a standalone logged run goes to

# %%
from workbench.notebook_params import (
    QUANT_VARIANTS,
    TRACKING,
    Dict,
    Float,
    Int,
    List,
    Model,
    Str,
    check_params,
)

check_params(
    globals(),
    model=Model(),
    variants=List(Str(choices=QUANT_VARIANTS)),
    int4_group_size=Int(choices=(32, 64, 128)),
    concurrencies=List(Int(min=1)),
    rounds=Int(min=1),
    input_len=Int(min=1),
    output_len=Int(min=1),
    memory_budget_mib=Float(min=0, min_open=True),
    quality_prompts=Int(min=1),
    quality_max_tokens=Int(min=1),
    ppl_tokens=Int(min=2),
    gate=Dict(),
    seed=Int(min=0),
    **TRACKING,
)

# the metrics `workbench sweep` shows per point (names or fnmatch patterns)
SWEEP_METRICS = ["*_tok_s_c*", "*_ppl_increase_pct", "*_kv_token_capacity"]

# %%
# %matplotlib inline
import pandas as pd
from IPython.display import Markdown, display

from workbench.analysis import bar_compare, memory_split
from workbench.analysis.notebook import publish, resolve_tracking_uri
from workbench.analysis.tables import row_metrics, skipped_note, variant_configs
from workbench.experiments.studies.quantization import compare_variants

MiB = 1 << 20
chosen = variant_configs(variants, int4_group_size=int4_group_size)
base_config = {"dtype": "float32", "max_model_len": 1024, "block_size": 16,
               "max_num_batched_tokens": 2048,
               "cpu_memory_budget_bytes": int(memory_budget_mib * MiB)}
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
cmp = compare_variants(
    model, chosen, concurrencies, base_config, uri=uri, workload="balanced-chat",
    workload_params={"input_len": {"kind": "fixed", "value": input_len},
                     "output_len": {"kind": "fixed", "value": output_len}},
    rounds=rounds, seed=seed, gate=gate, quality_prompts=quality_prompts,
    quality_max_tokens=quality_max_tokens, ppl_tokens=ppl_tokens)
if cmp.skipped:
    display(Markdown(skipped_note(cmp.skipped)))
side = cmp.side_by_side()
side

# %% [markdown]
# ## 1. Memory: the same budget, split differently
#
# Every engine gets the same whole-process budget (`cpu_memory_budget_bytes`); the KV pool
# gets what the weights and the measured activation peak leave. Smaller weights (int8, int4,
# FP8) or smaller KV elements (FP8 KV: 1 byte instead of 4 in float32) turn into KV token
# capacity. The embeddings and `lm_head` stay in full precision, which on a model this small
# is a large share of the weights.

# %%
mem = cmp.memory.set_index("variant")
mem[["weight_bytes", "kv_bytes", "bytes_per_block", "kv_bytes_per_token", "kv_token_capacity",
     "max_concurrency", "activation_peak_bytes", "budget_bytes"]]

# %%
parts = pd.DataFrame({"weights": mem["weight_bytes"], "KV cache": mem["kv_bytes"],
                      "activation peak": mem["activation_peak_bytes"].fillna(0),
                      "reserve": mem["reserve_bytes"].fillna(0)})
fig_memory = memory_split(parts, title=f"{model}: {memory_budget_mib} MiB budget per variant")
fig_memory

# %% [markdown]
# ## 2. Quality: each variant against full precision
#
# The experiments' quality gate, once per group on the first `quality_prompts` prompts of the
# traffic: perplexity on held-out text (the demo corpus's held-out stdlib files, never
# trained on), mean KL(full || variant) and top-1 agreement of next-token distributions on
# the full model's greedy continuations (teacher-forced), and greedy agreement: identical
# tokens at identical positions, with the first divergence per prompt. Greedy agreement is
# harsh: one flipped near-tie shifts every later token, which is why the gate gives it a
# loose bound. `quality_reference` names what each row was judged against.

# %%
cmp.quality.set_index("variant")[["perplexity", "ppl_increase_pct", "mean_kl", "max_kl",
                                  "top1_agreement", "text_top1_agreement", "token_agreement",
                                  "identical_sequences", "first_divergence",
                                  "quality_reference", "gate", "gate_reasons"]]

# %% [markdown]
# ## 3. Speed on this CPU: throughput and TPOT at each concurrency
#
# Same seeded requests for every variant, closed loop, after two warm-up requests, a fresh
# engine per run.

# %%
cmp.perf.sort_values("concurrency", kind="stable").set_index(["concurrency", "variant"])[
    ["requests", "output_throughput", "median_tpot_ms", "p95_tpot_ms", "median_ttft_ms",
     "mean_decode_step_ms", "valid"]]

# %%
fig_throughput = bar_compare(cmp.perf, x="variant", y="output_throughput", col="concurrency",
                             title="output tok/s on CPU (higher is better)")
fig_throughput

# %%
fig_tpot = bar_compare(cmp.perf, x="variant", y="median_tpot_ms", col="concurrency",
                       title="median TPOT on CPU (lower is better)")
fig_tpot

# %% [markdown]
# **Why the quantized variants are slower here.** One forward of the first layer's
# `gate_up_proj`, alone, at 1 and 32 tokens: the dense float32 matmul against dequantize
# (int8, int4: unpack nibbles, scale, add zeros) + matmul, and FP8's per-token activation
# quantization + emulated e4m3 matmul. On a GPU the dequantization is fused into the GEMM
# kernel and hidden behind the weight reads it saves; here it is paid in full on every call.

# %%
cmp.layer_table()

# %%
speeds = [c for c in side.columns if c.startswith("tok_s_c")]
metrics = row_metrics(side, "variant", ["kv_token_capacity", "ppl_increase_pct", "mean_kl",
                                        "top1_agreement", "token_agreement", *speeds])
publish("08_quantization", metrics=metrics,
        figures={"memory": fig_memory, "throughput": fig_throughput, "tpot": fig_tpot},
        tables={"side_by_side": side, "perf": cmp.perf, "memory": cmp.memory,
                "quality": cmp.quality.astype(str), "layer": cmp.layer},
        params={"model": model, "variants": variants, "memory_budget_mib": memory_budget_mib},
        figures_dir=figures_dir, mlflow_uri=mlflow_uri,
        mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)

# %% [markdown]
# ## What the figures show
#
# - **Memory** (the split and `kv_token_capacity`): weights + KV + activation peak fill the
#   same budget for every variant, so every byte int8/int4/FP8 takes off the weights becomes KV
#   capacity, and an FP8 KV cache stores a quarter of float32's bytes per token (half of bf16's
#   on a GPU), so the same KV bytes hold about four times the tokens. This is seed 001's
#   reallocation on a small scale; the embeddings and `lm_head` are not quantized, so the
#   saving is smaller than 4x / 8x of the weights.
# - **Quality**: the gate's figures against full precision. Held-out perplexity barely moves
#   here; KL and top-1 agreement rank the formats (int8 closest, int4 furthest); greedy
#   agreement falls fastest, since one flipped near-tie changes every later token.
# - **Speed on CPU**: the quantized variants are *slower* at both concurrencies, and the layer
#   timing shows why: dequantization is extra CPU work on every matmul, FP8 W8A8 is an exact
#   fp32 emulation (no FP8 tensor cores), and FP8 KV dequantizes every block attention reads
#   (the C++ decode kernel declines fp8), which costs most at concurrency 32, where decode
#   reads the most KV. **Do not read these as a GPU forecast.** On a GPU, decode at small batch
#   is memory-bound, so fewer weight bytes make int8/int4 faster at concurrency 1, while at
#   large batch the dequantization cost can win back; FP8 W8A8 runs on Hopper's FP8 tensor
#   cores; FP8 KV halves the bytes attention reads. Only the memory accounting and the quality
#   figures carry over as measured.
# - **Not shown**: the capacity gain turning into throughput (these requests fit the pool in
#   every variant; raise concurrency or lengths, or shrink the budget, to see preemptions fall),
#   calibrated FP8 KV scales (`calculate_kv_scales=True`), group sizes other than
#   `int4_group_size`, and any model larger than 7M parameters.
#
# **What this does not show.** The default model is the 6.8M-parameter demo Llama trained on
# Python's standard library (`bundled` is a random 2-layer one), on a shared 2-core CPU: a step
# costs a few milliseconds, much of it Python overhead, and other processes on the same cores add
# noise (torch's worker threads suffer most when the cores are busy). Absolute numbers say nothing
# about a GPU and the generated text is only Python-flavoured; only the *mechanisms* (which knob
# moves which metric, in which direction) carry over, and each should be re-measured on real
# hardware with a real model (the harness can point at a vLLM or SGLang server for that).
