"""Generate the notebooks in this folder from plain Python strings (rerun after editing).

    python notebooks/build_notebooks.py          # writes notebooks/0*.ipynb (outputs empty)

Each notebook: a markdown cell stating the question, a `parameters` cell (papermill) whose
defaults run in about a minute or less on 2 CPU cores with the bundled tiny checkpoint, code
cells that only call into the `workbench` package (glue: build, run, tabulate, plot), and a
closing markdown cell on what the figures do and do not show. Cell ids are fixed so a rebuild
only diffs where the text changed. Every notebook declares the tracking parameters that
`workbench sweep` injects (see workbench/analysis/notebook.py).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

TRACKING = '''
figures_dir = ""                # save every figure here as <name>.png when set
mlflow_uri = ""                 # MLflow store to log into; empty: none (or a temp store)
mlflow_parent_run_id = ""       # injected by `workbench sweep`: the run of this point
mlflow_experiment = "notebooks" # the experiment a standalone logged run goes to
'''.strip()

PUBLISH_KW = ("figures_dir=figures_dir, mlflow_uri=mlflow_uri,\n        "
              "mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment")

CPU_CAVEAT = (
    "**What this does not show.** The default model is the 6.8M-parameter demo Llama trained "
    "on Python's standard library (`bundled` is a random 2-layer one), on a shared "
    "2-core CPU: a step costs a few milliseconds, much of it Python overhead, and other "
    "processes on the same cores add noise (torch's worker threads suffer most when the cores "
    "are busy). Absolute numbers say nothing about a GPU and the generated text is "
    "only Python-flavoured; only the *mechanisms* (which knob moves which metric, in which direction) "
    "carry over, and each should be re-measured on real hardware with a real model (the "
    "harness can point at a vLLM or SGLang server for that)."
)

# --------------------------------------------------------------------------- 01 quickstart
QUICKSTART = [
    ("md", """# 01 · Quickstart: one engine, one measured run

**Question:** what does the engine do with a handful of prompts, step by step, and what does
one measured harness run report (vLLM's benchmark metrics, and how other tools would define
ITL and TPOT for the very same timestamps)?"""),
    ("params", f'''\
model = "demo"                  # "demo": the small Llama trained on Python's stdlib; "bundled": a random tiny one
num_prompts = 8                 # prompts for LLM.generate
max_tokens = 32                 # tokens generated per prompt
workload = "balanced-chat"      # harness fixture: balanced-chat, long-prefill, long-decode, ...
num_requests = 8                # requests in the measured run
concurrency = 4                 # closed loop: requests in flight
max_num_batched_tokens = 256    # the per-step token budget
seed = 0
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
import pandas as pd
from IPython.display import Markdown, display

from workbench import LLM, SamplingParams
from workbench.analysis import latency_ecdf, step_series
from workbench.analysis.notebook import publish
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import records_frame, summary_table
from workbench.bench.peer_metrics import peer_definitions
from workbench.harness.runner import run, run_sync
from workbench.harness.targets import InProcessTarget
from workbench.harness.workloads import make_workload
from workbench.demo import make_prompts
from workbench.named_models import resolve_model

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 1024,
                 "max_num_batched_tokens": max_num_batched_tokens}'''),
    ("md", "## 1. Generate with the engine\n\nGreedy decoding; each output carries the "
           "engine's per-request timestamps."),
    ("code", '''\
llm = LLM(model_path, seed=seed, **engine_kwargs)
outs = llm.generate(make_prompts(num_prompts, seed),
                    SamplingParams(temperature=0.0, max_tokens=max_tokens))
pd.DataFrame({
    "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
    "output_tokens": [len(o.outputs[0].token_ids) for o in outs],
    "finish_reason": [o.outputs[0].finish_reason for o in outs],
    "cached_tokens": [o.metrics.num_cached_tokens for o in outs],
    "ttft_s": [o.metrics.time_to_first_token_s for o in outs],
    "text": [o.outputs[0].text[:50] for o in outs],
})'''),
    ("md", "Engine counters and gauges under vLLM's metric names:"),
    ("code", 'pd.Series(llm.stats(), name="value").to_frame()'),
    ("md", "The step trace: one row per engine step (prefill and decode tokens in the step's "
           "budget, running and waiting requests, KV usage)."),
    ("code", '''\
trace = pd.DataFrame(llm.step_trace())
fig_steps = step_series(trace, title=f"LLM.generate: {num_prompts} prompts, budget "
                                     f"{max_num_batched_tokens} tokens/step")
fig_steps'''),
    ("md", "## 2. One measured harness run\n\nThe same engine behind the load generator: "
           "a seeded fixture, a closed loop, warm-model cache state (the default)."),
    ("code", '''\
wl = make_workload(workload, seed, llm.get_tokenizer(), num_requests=num_requests)
target = InProcessTarget(model_path, engine_kwargs)
result = run(target, wl, ArrivalSpec(mode="closed", concurrency=concurrency))
run_sync(target.stop)
metrics = result.metrics()
requests = records_frame(result.records)
print(f"workload {wl.name} checksum {wl.checksum[:12]}, valid run: {result.validity.valid}")
display(Markdown(summary_table(metrics)))'''),
    ("md", "Four tools, four definitions of ITL and TPOT, the same client timestamps:"),
    ("code", "peer_definitions(result.records)"),
    ("code", '''\
fig_ttft = latency_ecdf({f"{workload}, concurrency {concurrency}": requests}, "ttft_ms")
fig_ttft'''),
    ("code", f'''\
publish("01_quickstart", metrics=metrics, params=engine_kwargs,
        figures={{"step_trace": fig_steps, "ttft_ecdf": fig_ttft}}, tables={{"requests": requests}},
        {PUBLISH_KW})'''),
    ("md", f"""## What the figures show

- The **step trace** shows continuous batching: the first steps are prefill-heavy (prompts
  chunked into the per-step token budget, `max_num_batched_tokens`), then decode steps carry
  one token per running request until requests finish and `running` falls.
- The **summary table** is vLLM's `vllm bench serve` result for this run; the **peer table**
  shows why an ITL quoted from GuideLLM or LLMPerf is not comparable with vLLM's without
  converting definitions (TTFT included or not, per-request vs pooled, token-weighted).
- The **TTFT ECDF** is the distribution behind the percentiles; with a few requests its
  tail is a handful of points.

{CPU_CAVEAT}"""),
]

# --------------------------------------------------------------------------- 02 memory budget
MEMORY = [
    ("md", """# 02 · Memory budget: where the bytes go, and what the KV pool holds

**Question:** of a fixed device budget, how much goes to weights, KV cache, activations and
headroom, and how many tokens, and how many concurrent `max_model_len` requests, does the KV
pool hold as `block_size` and `max_model_len` change? Does the engine's own pool sizing
agree with the arithmetic in `workbench.calc`?"""),
    ("params", f'''\
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
available_mib = 64              # the pretend device budget (the tiny model needs very little)
activation_mib = 8              # reserved for activations
headroom_mib = 4                # kept free
block_size = 16
max_model_len = 1024
block_sizes = [8, 16, 32]       # the grid for capacity and concurrency
max_model_lens = [256, 1024, 2048]
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
import pandas as pd

from workbench import LLM
from workbench.analysis import grid_heatmap, memory_split
from workbench.analysis.notebook import publish
from workbench.calc import memory_budget
from workbench.named_models import resolve_model

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
MiB = 1 << 20'''),
    ("md", "## 1. The model's fixed costs, read from a minimal engine\n\nWeight bytes and KV "
           "bytes per token (2 x layers x KV heads x head dim x dtype bytes)."),
    ("code", '''\
probe = LLM(model_path, dtype="float32", block_size=block_size, max_model_len=max_model_len,
            num_gpu_blocks_override=max_model_len // block_size + 2)
probe_readout = probe.memory_readout()
pd.Series(probe_readout, name="value").to_frame()'''),
    ("md", "## 2. The split: calc's arithmetic vs the engine sized from the same KV budget"),
    ("code", '''\
budget = memory_budget(available_mib * MiB, probe_readout["weight_bytes"],
                       probe_readout["kv_bytes_per_token"], block_size,
                       activation_bytes=activation_mib * MiB, headroom_bytes=headroom_mib * MiB,
                       max_model_len=max_model_len)
llm = LLM(model_path, dtype="float32", block_size=block_size, max_model_len=max_model_len,
          kv_cache_memory_bytes=budget["kv_cache_bytes"])
readout = llm.memory_readout()
check = pd.DataFrame({
    "calc.memory_budget": [budget["weight_bytes"], budget["kv_num_blocks"],
                           budget["kv_token_capacity"], budget["max_concurrency"]],
    "engine.memory_readout": [readout["weight_bytes"], readout["num_blocks"],
                              readout["kv_token_capacity"], readout["max_concurrency"]],
}, index=["weight_bytes", "kv blocks", "kv_token_capacity", "max_concurrency"])
check'''),
    ("md", "The engine reserves block 0 as the null block, so it reports one usable block "
           "(`block_size` tokens) fewer than calc's count of every block in the budget."),
    ("code", '''\
parts = pd.DataFrame({
    "weights": [budget["weight_bytes"]], "KV cache": [budget["kv_cache_bytes"]],
    "activations": [budget["activation_bytes"]], "headroom": [budget["headroom_bytes"]],
}, index=[f"{available_mib} MiB budget"])
fig_split = memory_split(parts, title=f"{available_mib} MiB: weights / KV / activations / headroom")
fig_split'''),
    ("md", "## 3. KV token capacity and max concurrency vs block size and max_model_len"),
    ("code", '''\
grid = pd.DataFrame([
    {"block_size": bs, "max_model_len": mml,
     **{k: memory_budget(available_mib * MiB, budget["weight_bytes"],
                         budget["kv_bytes_per_token"], bs,
                         activation_bytes=activation_mib * MiB,
                         headroom_bytes=headroom_mib * MiB, max_model_len=mml)[k]
        for k in ("kv_num_blocks", "kv_token_capacity", "max_concurrency")}}
    for bs in block_sizes for mml in max_model_lens
])
grid'''),
    ("code", '''\
fig_conc = grid_heatmap(grid, "block_size", "max_model_len", "max_concurrency", fmt=".1f",
                        title="max concurrency at max_model_len")
fig_conc'''),
    ("md", "The engine agrees at every block size (same KV bytes, its own pool sizing):"),
    ("code", '''\
engine_rows = []
for bs in block_sizes:
    r = LLM(model_path, dtype="float32", block_size=bs, max_model_len=max_model_len,
            kv_cache_memory_bytes=budget["kv_cache_bytes"]).memory_readout()
    engine_rows.append({"block_size": bs, "engine_num_blocks": r["num_blocks"],
                        "engine_kv_token_capacity": r["kv_token_capacity"],
                        "engine_max_concurrency": r["max_concurrency"]})
engine_check = pd.DataFrame(engine_rows).merge(
    grid[grid["max_model_len"] == max_model_len], on="block_size")
engine_check'''),
    ("code", f'''\
publish("02_memory_budget",
        metrics={{k: v for k, v in budget.items() if isinstance(v, int | float)}},
        figures={{"memory_split": fig_split, "max_concurrency": fig_conc}},
        tables={{"capacity_grid": grid, "engine_check": engine_check}},
        {PUBLISH_KW})'''),
    ("md", f"""## What the figures show

- The **split** is the seed's accounting: with a fixed budget, KV gets what weights,
  activations and headroom leave; shrinking the weights (quantization) would move bytes into
  KV capacity one for one.
- **KV token capacity** hardly depends on `block_size` (only rounding), but **max
  concurrency** at `max_model_len` halves when `max_model_len` doubles: it counts requests
  that could each grow to `max_model_len`, a worst case, not what a real mix of lengths
  achieves.
- Activations and headroom are set by hand here; on a GPU they come from a profiling pass
  (peak memory of a forward at `max_num_batched_tokens`), and CUDA graphs add a reserve.

{CPU_CAVEAT}"""),
]

# --------------------------------------------------------------------------- 03 chunked prefill
CHUNKED = [
    ("md", """# 03 · Chunked-prefill budget: the TTFT vs ITL trade-off

**Question:** on long-prefill traffic, does a smaller per-step token budget
(`max_num_batched_tokens`) cut p95 ITL of the requests already decoding, and what does it
cost in TTFT? One variable, a baseline, the same seeded traffic for every value, repeats
interleaved, a verdict against the baseline's noise band, all logged to MLflow."""),
    ("params", f'''\
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
baseline_budget = 512           # max_num_batched_tokens of the baseline
budgets = [64, 2048]            # the values tried against it
num_requests = 12               # long-prefill requests (prompts ~384 tokens, 8..32 out)
rate = 40.0                     # Poisson arrivals, requests/s
repeats = 2                     # runs per value (baseline included), interleaved
seed = 0
experiment = "nb-chunked-prefill-budget"   # MLflow experiment of the sweep
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
from IPython.display import Markdown, display

from workbench.analysis import runs_frame, sweep_tradeoff
from workbench.analysis.notebook import ensure_experiment, publish, resolve_tracking_uri
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template

uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
print("MLflow store:", uri)'''),
    ("code", '''\
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
                 "max_num_batched_tokens": baseline_budget, "enable_chunked_prefill": True,
                 "enable_prefix_caching": True},
    "variable": {"name": "max_num_batched_tokens", "values": budgets},
    "repeats": repeats,
    "cache_state": "warm-model",
})
ensure_experiment(template.name, uri)  # artifacts beside the sqlite file, not in notebooks/
result = run_experiment(template, uri=uri)'''),
    ("md", "The verdict per value (medians over repeats; a change counts only beyond the "
           "baseline's noise band; adoption also needs the SLO and valid runs):"),
    ("code", "display(Markdown(result.table))"),
    ("code", '''\
runs = runs_frame(experiment, uri, parent_run_id=result.parent_run_id)
runs = runs[runs["status"] == "FINISHED"]
runs[["tags.value", "tags.repeat", "params.engine.max_num_batched_tokens", "metrics.p95_ttft_ms",
      "metrics.p95_itl_ms", "metrics.p95_tpot_ms", "metrics.prefill_step_share",
      "metrics.output_throughput"]]'''),
    ("code", '''\
fig_tradeoff = sweep_tradeoff(runs, x="max_num_batched_tokens",
                              ys=["p95_ttft_ms", "p95_itl_ms"],
                              title=f"long-prefill, Poisson {rate:g} req/s, {repeats} repeats")
fig_tradeoff'''),
    ("code", f'''\
publish("03_chunked_prefill_sweep", metrics={{"num_runs": len(runs)}},
        tags={{"experiment_parent_run_id": result.parent_run_id, "adopted": str(result.adopted)}},
        figures={{"tradeoff": fig_tradeoff}}, tables={{"runs": runs}},
        {PUBLISH_KW})'''),
    ("md", f"""## What the figure shows

- **Left / middle:** p95 TTFT and p95 ITL against the budget (median of the repeats; the
  band is their range). A small budget chunks each long prompt over many steps, so decodes
  that share those steps wait less per token (ITL down) while the new prompt's first token
  comes later (TTFT up); a large budget does the opposite.
- **Right:** the trade-off curve, one point per budget. The adoption rule in the table
  picks a point only if p95 ITL improves beyond noise *and* the TTFT/TPOT SLO still holds.
- Two repeats make a thin noise band: treat "better"/"worse" here as a smoke test of the
  method, not a finding. Raise `repeats` and `num_requests` for a real answer.

{CPU_CAVEAT} On CPU, a step's cost grows with its token count (no idle GPU parallelism to
absorb a bigger chunk), which exaggerates how much a big budget hurts ITL."""),
]

# --------------------------------------------------------------------------- 04 prefix caching
PREFIX = [
    ("md", """# 04 · Prefix caching: who gains, and in which cache state

**Question:** how much TTFT does prefix caching save on traffic that shares long prefixes,
compared with the same lengths without sharing, and how does the answer depend on the cache
state the measurement starts from (cold engine / warm model / warm prefix cache)? Caching
on vs off is the one variable; traffic and cache state are the conditions."""),
    ("params", f'''\
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
num_requests = 12
num_prefix_groups = 2           # shared traffic: request i uses prefix i % groups
prefix_len = 256                # tokens of the shared prefix (16 full blocks at block_size 16)
concurrency = 4                 # closed loop
cache_states = ["cold", "warm-model", "warm-prefix"]
caching = [True, False]         # enable_prefix_caching
seed = 0
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
import pandas as pd

from workbench.analysis import bar_compare, latency_ecdf
from workbench.analysis.notebook import publish
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import records_frame
from workbench.harness.runner import run, run_sync
from workbench.harness.targets import InProcessTarget
from workbench.harness.workloads import make_workload
from workbench.named_models import resolve_model
from workbench.models.tokenizer import load_tokenizer

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 1024, "block_size": 16,
                 "max_num_batched_tokens": 512}'''),
    ("md", "Two workloads with the same length distributions: `shared` puts the requests in "
           "a few prefix groups, `unique` gives every request its own prefix."),
    ("code", '''\
tok = load_tokenizer(model_path)
common = {"num_requests": num_requests, "prefix_len": prefix_len}
workloads = {
    "shared": make_workload("shared-prefix", seed, tok, num_prefix_groups=num_prefix_groups,
                            **common),
    "unique": make_workload("shared-prefix", seed, tok, num_prefix_groups=num_requests, **common),
}
pd.DataFrame([{"traffic": k, **{c: v for c, v in w.summary().items() if c != "params"}}
              for k, w in workloads.items()])'''),
    ("code", '''\
rows, requests = [], {}
for caching_on in caching:
    target = InProcessTarget(model_path, {**engine_kwargs, "enable_prefix_caching": caching_on})
    for traffic, wl in workloads.items():
        for state in cache_states:
            res = run(target, wl, ArrivalSpec(mode="closed", concurrency=concurrency),
                      cache_state=state)
            m, d = res.metrics(), res.server_delta
            hits = d.get("vllm:prefix_cache_hits", 0)
            queries = d.get("vllm:prefix_cache_queries", 0)
            rows.append({"traffic": traffic, "cache_state": state, "prefix_caching": caching_on,
                         "median_ttft_ms": m["median_ttft_ms"], "p95_ttft_ms": m["p95_ttft_ms"],
                         "hit_rate": hits / queries if queries else 0.0,
                         "hit_tokens": hits, "query_tokens": queries, "valid": res.validity.valid})
            requests[f"{traffic}, {state}, caching {'on' if caching_on else 'off'}"] = (
                records_frame(res.records))
    run_sync(target.stop)
table = pd.DataFrame(rows)
table'''),
    ("code", '''\
fig_ttft = bar_compare(table, x="cache_state", y="median_ttft_ms", hue="prefix_caching",
                       col="traffic", title="median TTFT")
fig_ttft'''),
    ("code", '''\
fig_hits = bar_compare(table, x="cache_state", y="hit_rate", hue="prefix_caching",
                       col="traffic", title="prefix-cache hit rate (tokens)")
fig_hits'''),
    ("code", '''\
fig_ecdf = latency_ecdf({k: v for k, v in requests.items() if k.startswith("shared")},
                        "ttft_ms", title="TTFT ECDF, shared-prefix traffic")
fig_ecdf'''),
    ("code", f'''\
shared_on = table[(table["traffic"] == "shared") & table["prefix_caching"]]
publish("04_prefix_caching",
        metrics={{f"hit_rate.{{s}}": h
                 for s, h in zip(shared_on["cache_state"], shared_on["hit_rate"])}},
        figures={{"median_ttft": fig_ttft, "hit_rate": fig_hits, "ttft_ecdf": fig_ecdf}},
        tables={{"conditions": table}}, {PUBLISH_KW})'''),
    ("md", f"""## What the figures show

- **Hit rate** (cached tokens / looked-up tokens in the measured run): `warm-prefix` replays
  every request once before measuring, so nearly every full prefix block hits, even for
  `unique` traffic (its own prefix was seen); `cold` and `warm-model` start the measured run
  with an empty cache, so only sharing *within* the run hits: high for `shared`, zero for
  `unique`; with caching off it is 0 everywhere. Only full blocks are cached, and the last
  prompt token is always recomputed.
- **TTFT** falls with the hit rate because a hit skips that part of the prefill. The `cold`
  state also pays one-off engine start-up costs in its first requests, which is why the
  cache state must be stated with any TTFT number.
- Not shown: eviction under memory pressure (the pool here is far larger than the working
  set), and the cost of hashing, which is noise at this scale.

{CPU_CAVEAT}"""),
]

# --------------------------------------------------------------------------- 05 saturation
SATURATION = [
    ("md", """# 05 · Saturation: throughput and latency vs concurrency

**Question:** as closed-loop concurrency grows from 1, where does output throughput stop
growing, and what happens to TPOT and TTFT past that point? With `max_num_seqs` capping the
running batch, the knee should sit at `max_num_seqs`: beyond it extra requests only queue."""),
    ("params", f'''\
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
workload = "balanced-chat"
num_requests = 16               # requests per concurrency level
concurrencies = [1, 2, 4, 8]    # closed-loop levels
max_num_seqs = 4                # the running-batch cap: the expected knee
repeats = 1
seed = 0
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
import pandas as pd

from workbench.analysis import saturation_curve, step_series
from workbench.analysis.notebook import publish
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.runner import run, run_sync
from workbench.harness.targets import InProcessTarget
from workbench.harness.workloads import make_workload
from workbench.named_models import resolve_model
from workbench.models.tokenizer import load_tokenizer

model_path = resolve_model(model)  # a folder, or bundled / demo / demo-draft
engine_kwargs = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": max_num_seqs,
                 "max_num_batched_tokens": 512}
wl = make_workload(workload, seed, load_tokenizer(model_path), num_requests=num_requests)
wl.summary()'''),
    ("code", '''\
target = InProcessTarget(model_path, engine_kwargs)
rows, traces = [], {}
for c in concurrencies:
    for r in range(repeats):
        res = run(target, wl, ArrivalSpec(mode="closed", concurrency=c))
        rows.append({"concurrency": c, "repeat": r, "valid": res.validity.valid, **res.metrics()})
        traces[c] = res.step_trace
run_sync(target.stop)
frame = pd.DataFrame(rows)
frame[["concurrency", "repeat", "output_throughput", "request_throughput", "median_ttft_ms",
       "p95_ttft_ms", "p95_tpot_ms", "mean_server_queue_ms", "valid"]]'''),
    ("code", '''\
fig_sat = saturation_curve(frame, x="concurrency",
                           ys=["output_throughput", "p95_tpot_ms", "p95_ttft_ms"],
                           knee=max_num_seqs, title=f"{workload}, max_num_seqs={max_num_seqs}")
fig_sat'''),
    ("md", "The step trace at the highest concurrency: `running` is pinned at `max_num_seqs` "
           "and the rest wait."),
    ("code", '''\
fig_trace = step_series(traces[max(concurrencies)],
                        title=f"concurrency {max(concurrencies)}, max_num_seqs {max_num_seqs}")
fig_trace'''),
    ("code", f'''\
peak = frame.loc[frame["output_throughput"].idxmax()]
publish("05_saturation",
        metrics={{"peak_output_throughput": peak["output_throughput"],
                 "peak_concurrency": peak["concurrency"]}},
        figures={{"saturation": fig_sat, "step_trace": fig_trace}}, tables={{"levels": frame}},
        {PUBLISH_KW})'''),
    ("md", f"""## What the figures show

- **Throughput** rises with concurrency while the batch grows (one forward serves more
  requests) and flattens at `max_num_seqs`: past the knee the batch is full.
- **TPOT** stays roughly flat past the knee (the running batch no longer grows), while
  **TTFT** climbs: the extra requests wait in the queue (`mean_server_queue_ms`), which is
  exactly what a concurrency above `max_num_seqs` buys.
- On a GPU the throughput curve keeps rising much longer below the knee (a decode step is
  memory-bound, so a bigger batch is nearly free); on this CPU a step's cost grows with the
  batch, so the gain per extra request is small and the curve is noisy. One repeat per level
  gives no noise band; raise `repeats` before reading a knee off a real model.

{CPU_CAVEAT}"""),
]

# --------------------------------------------------------------------------- 06 compare runs
COMPARE = [
    ("md", """# 06 · Compare runs: baseline vs variants from MLflow

**Question:** for one logged experiment, how does each variant differ from the baseline on
each metric, is the difference beyond the baseline's noise, and what do the latency
distributions behind the medians look like? Given `parent_run_id` (and `mlflow_uri`), it reads
that experiment; left empty, it first runs a small version of the example template
`experiments/chunked_prefill_budget.yaml`."""),
    ("params", f'''\
parent_run_id = ""              # parent run of an experiment; empty: run the example
template_path = "../experiments/chunked_prefill_budget.yaml"  # relative to notebooks/
values = [128, 2048]            # example run only: variable values (empty: the template ones)
repeats = 2                     # example run only
num_requests = 8                # example run only
compare_metrics = ["p95_itl_ms", "p95_ttft_ms", "p95_tpot_ms", "output_throughput"]
noise = ""                      # "spread" | "bootstrap" | "" (as in the template)
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
from IPython.display import Markdown, display

from workbench.analysis import (compare_frame, compare_plot, latency_ecdf, request_frames,
                                runs_frame)
from workbench.analysis.notebook import ensure_experiment, publish, resolve_tracking_uri
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import load_template, parse_template

if parent_run_id and not mlflow_uri:
    raise ValueError("parent_run_id needs mlflow_uri: the tracking store that holds it")
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
print("MLflow store:", uri)'''),
    ("code", '''\
if not parent_run_id:
    raw = load_template(template_path).raw
    raw.pop("quality_gate", None)
    raw["repeats"] = repeats
    raw["variable"] = {"name": raw["variable"]["name"],
                       "values": values or raw["variable"]["values"]}
    raw["workload"]["params"] = {**raw["workload"].get("params", {}), "num_requests": num_requests}
    ensure_experiment(raw["name"], uri)  # artifacts beside the sqlite file, not in notebooks/
    example = run_experiment(parse_template(raw), uri=uri)
    parent_run_id = example.parent_run_id
    display(Markdown(example.table))
print("parent run:", parent_run_id)'''),
    ("code", '''\
runs = runs_frame(None, uri, parent_run_id=parent_run_id)
runs[["run_name", "status", "tags.value", "tags.repeat", *[f"metrics.{m}" for m in compare_metrics
                                                           if f"metrics.{m}" in runs]]]'''),
    ("md", "Baseline vs each variant: medians over the FINISHED repeats, the delta, the noise "
           "band of the difference, and the verdict the adoption rule uses."),
    ("code", '''\
cf = compare_frame(parent_run_id, compare_metrics, uri, noise=noise or None)
cf'''),
    ("code", '''\
fig_compare = compare_plot(cf)
fig_compare'''),
    ("md", "The distributions behind the medians (repeat 0 of every value):"),
    ("code", '''\
per_value = request_frames(parent_run_id, uri)
fig_ttft = latency_ecdf(per_value, "ttft_ms", title="TTFT by value")
fig_ttft'''),
    ("code", '''\
fig_itl = latency_ecdf(per_value, "itl_ms", title="ITL gaps by value")
fig_itl'''),
    ("code", f'''\
publish("06_compare_runs", tags={{"compared_parent_run_id": parent_run_id}},
        metrics={{f"{{m}}.{{v}}.relative_effect": e
                 for m, v, e in zip(cf["metric"], cf["value"], cf["relative_effect"])}},
        figures={{"compare": fig_compare, "ttft_ecdf": fig_ttft, "itl_ecdf": fig_itl}},
        tables={{"compare": cf}}, {PUBLISH_KW})'''),
    ("md", f"""## What the figures show

- **The comparison plot** puts every metric on one scale, % change of the median vs the
  baseline's; the line through each point is the noise band of the difference (the baseline
  repeats' range, or a bootstrap interval). Only a band that excludes 0 is a change;
  the marker says which way the verdict went.
- **The ECDFs** show whether a change in a percentile is a shift of the whole distribution
  or a few tail requests; with a handful of requests per run the tail is a few points.
- Caveats of this run: a noise band from two repeats is a crude estimate (use more
  repeats, or `noise="bootstrap"` with enough of them), and the example run drops the
  template's quality gate to stay fast.

{CPU_CAVEAT}"""),
]

# --------------------------------------------------------------------------- 07 speculative
SPECULATIVE = [
    ("md", """# 07 · Speculative decoding: speed-up vs k, per concurrency

**Question:** on repetitive traffic ("repeat this text"), how much does speculation speed up
greedy decoding as the number of draft tokens k grows, at each concurrency; does the
measured speed-up follow the one predicted from forward-pass counts (seed 002:
output / (output - accepted)); and how does acceptance fall off by draft position? Output
must stay token-for-token identical to no speculation.

One k per run: sweep it with
`workbench sweep notebooks/07_speculative_decoding.ipynb -p num_speculative_tokens 0 1 2 3 5 8`
(each point logs its numbers into its MLflow child run; every point then redraws the curve
from all points finished so far, so the last one holds the whole sweep)."""),
    ("params", f'''\
model = "demo"                  # the trained demo target (workbench/assets/demo-target)
method = "ngram"                # "ngram" (prompt lookup) or "draft_model"
draft_model = "demo-draft"      # the draft model for method "draft_model"
num_speculative_tokens = 5      # k (0: speculation off)
concurrencies = [1, 4]          # engine max_num_seqs, all requests submitted at once
num_requests = 8                # repetitive requests per concurrency (at least 2 x C)
runs = 2                        # timed runs per point (median), after one warm-up
seed = 0
{TRACKING}'''),
    ("code", """\
%matplotlib inline
from IPython.display import Markdown, display

from workbench.analysis.notebook import publish
from workbench.analysis.spec import (acceptance_by_position, speedup_vs_k, spec_frame,
                                     spec_metrics, sweep_spec_frame)
from workbench.bench.spec import compare, repetitive_requests, table

k = int(num_speculative_tokens)
if method == "ngram":
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2,
            "prompt_lookup_max": 5}
else:
    spec = {"method": "draft_model", "model": draft_model, "num_speculative_tokens": k}
points = []
for c in concurrencies:
    prompts, max_tokens = repetitive_requests(model, max(num_requests, 2 * c), seed)
    points += compare(model, prompts, max_tokens, c,
                      [] if k == 0 else [(f"{method} k={k}", spec)], runs)
display(Markdown(table(points)))
frame = spec_frame(points, k)
assert frame["identical"].all(), "speculation changed the greedy output"
frame"""),
    ("code", """\
metrics = spec_metrics(frame)
if mlflow_uri and mlflow_parent_run_id:  # a sweep point: log first, then read all points
    publish("07_speculative_decoding", metrics=metrics, mlflow_uri=mlflow_uri,
            mlflow_parent_run_id=mlflow_parent_run_id, mlflow_experiment=mlflow_experiment)
    curve = sweep_spec_frame(mlflow_uri, mlflow_parent_run_id)
else:
    curve = frame
fig_speedup = speedup_vs_k(curve, title=f"{method} on {model}: speed-up vs k")
fig_speedup"""),
    ("code", """\
fig_acceptance = acceptance_by_position(curve[curve["k"] > 0],
                                        title=f"{method}: acceptance by draft position")
fig_acceptance"""),
    ("code", f"""\
publish("07_speculative_decoding", metrics=metrics,
        figures={{"speedup_vs_k": fig_speedup, "acceptance_by_position": fig_acceptance}},
        tables={{"points": frame.drop(columns=["acceptance_by_position"])}},
        params={{"model": model, "method": method, "num_speculative_tokens": k}},
        {PUBLISH_KW})"""),
    ("md", f"""## What the figures show

- **Speed-up vs k:** measured output tok/s against the no-speculation run at the same
  concurrency (solid), and the prediction from forward-pass counts (dashed). The gap is the
  price of verification: scoring k + 1 positions costs more than one, and a rejected tail is
  wasted work. It widens with concurrency, where a step is already busy with other requests'
  tokens (seed 002: 1.91x at C=1, 1.76x at C=16 on a GPU).
- **Acceptance by position:** the per-position counter over the number of drafts; it can only
  fall with the position (position i needs every earlier one accepted), and its steps give the
  accepted-length distribution.
- Greedy output is asserted identical to no speculation in the first code cell.

{CPU_CAVEAT} Here the model is the trained demo target (trained on Python's standard
library), so acceptance is real, but a CPU step is dominated by fixed per-step costs, which
flatters speculation at low concurrency."""),
]

# --------------------------------------------------------------------------- 08 quantization
QUANTIZATION = [
    ("md", """# 08 · Quantization: where the bytes go, what it costs in quality, and speed on CPU

**Question:** under one fixed memory budget, how do full precision, int8 weights (W8A16),
int4 weights (W4A16), FP8 weights and activations (W8A8) and an FP8 KV cache compare on the
same traffic at concurrency 1 and 32: how many bytes move from weights to KV capacity
(`llm.memory_readout()`), what happens to output throughput and TPOT, and does each variant
pass the quality gate (`workbench.quality`: held-out perplexity, KL and top-1 agreement of
next-token distributions, greedy agreement with the full-precision model)?

**Read the speed numbers as a CPU's, not a GPU's.** On a GPU, decode at small batch is
memory-bound, so fewer weight bytes per step make int8/int4 *faster*, and FP8 W8A8 runs on
FP8 tensor cores (Hopper, `torch._scaled_mm`). On this CPU there is no such hardware: every
matmul first dequantizes its weights (extra work, not fewer bytes), FP8 is emulated exactly in
fp32, and attention dequantizes every FP8 KV block it reads. The quantized variants are
expected to be *slower* here; section 3 measures by how much, down to one linear layer."""),
    ("params", f'''\
model = "demo"                  # the trained demo target (bundled: a random tiny Llama)
variants = ["full", "int8", "int4", "fp8", "fp8-kv"]   # keys of workbench.bench.quant.VARIANTS
int4_group_size = 128           # quantization_group_size of int4: 32, 64 or 128
concurrencies = [1, 32]         # closed-loop concurrency (engine max_num_seqs: the largest)
rounds = 2                      # requests per concurrency: max(4, rounds x C)
input_len = 64                  # every prompt this many tokens (same traffic for all)
output_len = 32                 # every request generates this many tokens
memory_budget_mib = 96          # whole-process budget: weights + activation peak + KV
quality_prompts = 8             # golden prompts for greedy agreement and KL
quality_max_tokens = 32         # greedy tokens per golden prompt
ppl_tokens = 4096               # held-out stdlib tokens scored for perplexity
gate = {{"min_token_agreement": 0.5, "max_ppl_increase_pct": 1.0, "max_mean_kl": 0.01,
        "min_top1_agreement": 0.95}}    # the quality gate (as in experiments/quantization.yaml)
seed = 0
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
import pandas as pd
from IPython.display import Markdown, display

from workbench.analysis import bar_compare, memory_split
from workbench.analysis.notebook import publish
from workbench.bench.quant import VARIANTS, compare_variants

MiB = 1 << 20
chosen = {v: dict(VARIANTS[v]) for v in variants}
if "int4" in chosen:
    chosen["int4"]["quantization_group_size"] = int4_group_size
base_config = {"dtype": "float32", "max_model_len": 1024, "block_size": 16,
               "max_num_batched_tokens": 2048,
               "cpu_memory_budget_bytes": int(memory_budget_mib * MiB)}
cmp = compare_variants(
    model, chosen, concurrencies, base_config, workload="balanced-chat",
    workload_params={"input_len": {"kind": "fixed", "value": input_len},
                     "output_len": {"kind": "fixed", "value": output_len}},
    rounds=rounds, seed=seed, gate=gate, quality_prompts=quality_prompts,
    quality_max_tokens=quality_max_tokens, ppl_tokens=ppl_tokens)
if cmp.skipped:
    display(Markdown("**Skipped** (the engine refused the config):\\n\\n" + "\\n".join(
        f"- `{k}`: {v}" for k, v in cmp.skipped.items())))
side = cmp.side_by_side()
side'''),
    ("md", """## 1. Memory: the same budget, split differently

Every engine gets the same whole-process budget (`cpu_memory_budget_bytes`); the KV pool
gets what the weights and the measured activation peak leave. Smaller weights (int8, int4,
FP8) or smaller KV elements (FP8 KV: 1 byte instead of 4 in float32) turn into KV token
capacity. The embeddings and `lm_head` stay in full precision, which on a model this small
is a large share of the weights."""),
    ("code", '''\
mem = cmp.memory.set_index("variant")
mem[["weight_bytes", "kv_bytes", "bytes_per_block", "kv_bytes_per_token", "kv_token_capacity",
     "max_concurrency", "activation_peak_bytes", "budget_bytes"]]'''),
    ("code", '''\
parts = pd.DataFrame({"weights": mem["weight_bytes"], "KV cache": mem["kv_bytes"],
                      "activation peak": mem["activation_peak_bytes"].fillna(0),
                      "reserve": mem["reserve_bytes"].fillna(0)})
fig_memory = memory_split(parts, title=f"{model}: {memory_budget_mib} MiB budget per variant")
fig_memory'''),
    ("md", """## 2. Quality: each variant against full precision

Perplexity on held-out text (the demo corpus's held-out stdlib files, never trained on),
mean KL(full || variant) and top-1 agreement of next-token distributions on the full
model's greedy continuations (teacher-forced), and greedy agreement: identical tokens at
identical positions, with the first divergence per prompt. Greedy agreement is harsh: one
flipped near-tie shifts every later token, which is why the gate gives it a loose bound."""),
    ("code", '''\
cmp.quality.set_index("variant")[["perplexity", "ppl_increase_pct", "mean_kl", "max_kl",
                                  "top1_agreement", "text_top1_agreement", "token_agreement",
                                  "identical_sequences", "first_divergence", "gate",
                                  "gate_reasons"]]'''),
    ("md", """## 3. Speed on this CPU: throughput and TPOT at each concurrency

Same seeded requests for every variant, closed loop, after two warm-up requests."""),
    ("code", '''\
cmp.perf.sort_values("concurrency", kind="stable").set_index(["concurrency", "variant"])[
    ["requests", "output_throughput", "median_tpot_ms", "p95_tpot_ms", "median_ttft_ms",
     "mean_decode_step_ms", "valid"]]'''),
    ("code", '''\
fig_throughput = bar_compare(cmp.perf, x="variant", y="output_throughput", col="concurrency",
                             title="output tok/s on CPU (higher is better)")
fig_throughput'''),
    ("code", '''\
fig_tpot = bar_compare(cmp.perf, x="variant", y="median_tpot_ms", col="concurrency",
                       title="median TPOT on CPU (lower is better)")
fig_tpot'''),
    ("md", """**Why the quantized variants are slower here.** One forward of the first layer's
`gate_up_proj`, alone, at 1 and 32 tokens: the dense float32 matmul against dequantize
(int8, int4: unpack nibbles, scale, add zeros) + matmul, and FP8's per-token activation
quantization + emulated e4m3 matmul. On a GPU the dequantization is fused into the GEMM
kernel and hidden behind the weight reads it saves; here it is paid in full on every call."""),
    ("code", '''\
cmp.layer_table()'''),
    ("code", f'''\
metrics = {{}}
for _, row in side.iterrows():
    for key in ("kv_token_capacity", "ppl_increase_pct", "mean_kl", "top1_agreement",
                "token_agreement", *[c for c in side.columns if c.startswith("tok_s_c")]):
        if pd.notna(row.get(key)):
            metrics[f"{{row['variant']}}_{{key}}"] = float(row[key])
publish("08_quantization", metrics=metrics,
        figures={{"memory": fig_memory, "throughput": fig_throughput, "tpot": fig_tpot}},
        tables={{"side_by_side": side, "perf": cmp.perf, "memory": cmp.memory,
                "quality": cmp.quality.astype(str), "layer": cmp.layer}},
        params={{"model": model, "variants": variants, "memory_budget_mib": memory_budget_mib}},
        {PUBLISH_KW})'''),
    ("md", f"""## What the figures show

- **Memory** (the split and `kv_token_capacity`): weights + KV + activation peak fill the
  same budget for every variant, so every byte int8/int4/FP8 takes off the weights becomes KV
  capacity, and an FP8 KV cache stores a quarter of float32's bytes per token (half of bf16's
  on a GPU), so the same KV bytes hold about four times the tokens. This is seed 001's
  reallocation on a small scale; the embeddings and `lm_head` are not quantized, so the
  saving is smaller than 4x / 8x of the weights.
- **Quality**: the gate's figures against full precision. Held-out perplexity barely moves
  here; KL and top-1 agreement rank the formats (int8 closest, int4 furthest); greedy
  agreement falls fastest, since one flipped near-tie changes every later token.
- **Speed on CPU**: the quantized variants are *slower* at both concurrencies, and the layer
  timing shows why: dequantization is extra CPU work on every matmul, FP8 W8A8 is an exact
  fp32 emulation (no FP8 tensor cores), and FP8 KV dequantizes every block attention reads
  (the C++ decode kernel declines fp8), which costs most at concurrency 32, where decode
  reads the most KV. **Do not read these as a GPU forecast.** On a GPU, decode at small batch
  is memory-bound, so fewer weight bytes make int8/int4 faster at concurrency 1, while at
  large batch the dequantization cost can win back; FP8 W8A8 runs on Hopper's FP8 tensor
  cores; FP8 KV halves the bytes attention reads. Only the memory accounting and the quality
  figures carry over as measured.
- **Not shown**: the capacity gain turning into throughput (these requests fit the pool in
  every variant; raise concurrency or lengths, or shrink the budget, to see preemptions fall),
  calibrated FP8 KV scales (`calculate_kv_scales=True`), group sizes other than
  `int4_group_size`, and any model larger than 7M parameters.

{CPU_CAVEAT}"""),
]


# --------------------------------------------------------------------------- 09 TP vs replicas
TP_VS_REPLICAS = [
    ("md", """# 09 · Two workers: tensor parallelism (TP=2) or two replicas?

**Question:** with the same two worker processes (one intra-op thread each) and the same
closed-loop chat traffic, is it better to run **one engine with `tensor_parallel_size=2`**
(every step's weights and compute split over both workers, an all-reduce after `o_proj` and
`down_proj` of every layer) or **two independent replicas** behind `workbench router`
(requests split, no communication)? Output throughput, TTFT and TPOT tails, and the scaling
efficiency of each against one worker (throughput_N / (N x throughput_1)).

The experiment is `experiments/tp_vs_replicas.yaml` (run here with smaller numbers): the router
knob `num_workers: 2` holds the worker count fixed, so the one variable is
`tensor_parallel_size` (1: two replicas; 2: one replica of two ranks). Both layouts go through
the same router, so the router hop is in both. Then a one-worker reference run on the same
traffic, a concurrency-1 pair (the latency side), and the price of one all-reduce here."""),
    ("params", f'''\
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
template_file = ""              # empty: experiments/tp_vs_replicas.yaml of this checkout
num_requests = 24               # chat requests per run
concurrency = 8                 # closed-loop clients
repeats = 1                     # runs per layout (baseline included), interleaved
latency_requests = 6            # requests of the concurrency-1 pair; 0 skips it
allreduce_iters = 200           # timed all-reduces per size; 0 skips the measurement
port = 8126                     # the router's port
seed = 0
experiment = "nb-tp-vs-replicas"   # MLflow experiment of the runs
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
import json
from pathlib import Path

import pandas as pd
import yaml
from IPython.display import Markdown, display

import workbench
from workbench.analysis import bar_compare, latency_ecdf
from workbench.analysis.frames import run_artifact_frame
from workbench.analysis.notebook import ensure_experiment, publish, resolve_tracking_uri
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.metrics import records_frame
from workbench.harness.workloads import make_workload
from workbench.bench.collective_bench import allreduce_latency, collectives_per_step
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template
from workbench.models.tokenizer import load_tokenizer
from workbench.named_models import resolve_model
from workbench.router.experiment import (
    layout_row,
    local_target,
    run_layout,
    run_replica_summary,
)

path = Path(template_file) if template_file else (
    Path(workbench.__file__).resolve().parents[1] / "experiments" / "tp_vs_replicas.yaml")
raw = yaml.safe_load(path.read_text())
raw["name"] = experiment
raw["workload"]["seed"] = seed
raw["workload"]["params"]["num_requests"] = num_requests
raw["arrivals"] = {"mode": "closed", "concurrency": concurrency}
raw["repeats"] = repeats
raw["target"] = local_target(raw["target"], port=port, model=model)
template = parse_template(raw)
hf_config = json.loads((Path(resolve_model(model)) / "config.json").read_text())
workers = template.baseline["num_workers"]
LAYOUTS = {1: f"{workers} replicas (TP=1)", 2: "1 replica, TP=2"}
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
print("router command:", " ".join(template.target["command"][1:]))
print(f"model: {hf_config['num_hidden_layers']} layers, hidden {hf_config['hidden_size']}; "
      f"{workers} workers; MLflow store: {uri}")'''),
    ("md", "## 1. The experiment: 2 replicas (baseline) vs TP=2\n\nThe verdict table "
           "compares medians over repeats; with one repeat there is no noise band, so read "
           "it as the method at work, not a decision."),
    ("code", '''\
ensure_experiment(template.name, uri)
result = run_experiment(template, uri=uri)
display(Markdown(result.table))'''),
    ("md", "## 2. Against one worker: throughput, tails, scaling efficiency\n\n"
           "The same traffic on one worker (`num_workers: 1`, TP=1), then one row per "
           "layout: scaling efficiency = throughput / (2 x one worker's throughput)."),
    ("code", '''\
arrival = ArrivalSpec(mode="closed", concurrency=concurrency)
workload = make_workload(raw["workload"]["fixture"], seed, load_tokenizer(resolve_model(model)),
                         **raw["workload"]["params"])
assert workload.checksum == result.workload_checksum  # the experiment's traffic
single = run_layout(template.target, template.baseline, workload, arrival, 1, 1,
                    cache_state=template.cache_state, warmup_requests=template.warmup_requests)
throughput_1 = single.metrics()["output_throughput"]
rows = [layout_row("1 worker", single.metrics(), single.validity.valid, 1, throughput_1)]
requests = {"1 worker": records_frame(single.records)}
for r in result.runs:
    if r.error:
        print(f"{r.label} repeat {r.repeat} failed: {r.error}")
        continue
    tp = template.baseline["tensor_parallel_size"] if r.value is None else r.value
    replicas_seen = len(run_replica_summary(r.run_id, uri)) - 1  # rows: replicas + "all"
    rows.append({**layout_row(LAYOUTS[tp], r.metrics, r.valid, workers, throughput_1),
                 "repeat": r.repeat, "replicas_seen": replicas_seen})
    requests.setdefault(LAYOUTS[tp], run_artifact_frame(r.run_id, "requests.csv", uri))
layouts = pd.DataFrame(rows)
layouts'''),
    ("code", '''\
fig_tput = bar_compare(layouts, x="layout", y="output_throughput",
                       title=f"output tok/s, closed loop of {concurrency}")
fig_tput'''),
    ("code", '''\
fig_tpot = latency_ecdf(requests, "tpot_ms", title="TPOT per request")
fig_tpot'''),
    ("md", "## 3. The latency side: one request at a time\n\nAt concurrency 1 two replicas "
           "are one busy worker and one idle one; TP=2 puts both on the one request. This is "
           "where TP is supposed to win (a shorter step), if its communication costs less "
           "than the compute it halves."),
    ("code", '''\
latency = pd.DataFrame()
if latency_requests:
    wl1 = make_workload(raw["workload"]["fixture"], seed + 1,
                        load_tokenizer(resolve_model(model)),
                        **{**raw["workload"]["params"], "num_requests": latency_requests})
    one = ArrivalSpec(mode="closed", concurrency=1)
    lat_rows = []
    for tp in (1, 2):
        res = run_layout(template.target, template.baseline, wl1, one, workers, tp,
                         cache_state=template.cache_state,
                         warmup_requests=template.warmup_requests)
        lat_rows.append(layout_row(LAYOUTS[tp], res.metrics(), res.validity.valid, workers))
    latency = pd.DataFrame(lat_rows).drop(columns=["scaling_efficiency"])
latency'''),
    ("md", "## 4. Why: what one all-reduce costs here\n\nA TP forward pass makes "
           "`collectives_per_step(L)` = 2L + 2 collectives whatever the batch (embedding "
           "all-reduce, two per layer, the LM head's all-gather). Their latency times that "
           "count is the floor TP adds to every step. Sizes: one decode token, a decode batch "
           "of `concurrency`, a full prefill chunk (`max_num_batched_tokens`) of "
           "`hidden_size` fp32 values."),
    ("code", '''\
comm = pd.DataFrame()
if allreduce_iters:
    hidden = hf_config["hidden_size"]
    tokens = (1, concurrency, template.baseline["max_num_batched_tokens"])
    comm = pd.DataFrame(allreduce_latency(2, tuple(hidden * t for t in tokens),
                                          iters=allreduce_iters))
    comm.insert(0, "tokens", tokens)
    per_step = collectives_per_step(hf_config["num_hidden_layers"])
    comm["collectives_per_step"] = per_step
    comm["floor_ms_per_step"] = comm["median_us"] * per_step / 1000
if len(comm) and len(latency):
    tpot = latency.set_index("layout")["median_tpot_ms"]
    extra = tpot[LAYOUTS[2]] - tpot[LAYOUTS[1]]
    print(f"concurrency 1: TP=2 adds {extra:.1f} ms per token over one worker; the isolated "
          f"all-reduce floor is {comm['floor_ms_per_step'].iloc[0]:.1f} ms per step")
comm'''),
    ("code", f'''\
metrics = {{"throughput_1": float(throughput_1)}}
for name, key in (("replicas", LAYOUTS[1]), ("tp2", LAYOUTS[2])):
    g = layouts[layouts["layout"] == key]
    for k in ("output_throughput", "p95_ttft_ms", "p95_tpot_ms", "scaling_efficiency"):
        if len(g):
            metrics[f"{{name}}_{{k}}"] = float(g[k].median())
if len(latency):
    for name, key in (("replicas", LAYOUTS[1]), ("tp2", LAYOUTS[2])):
        metrics[f"{{name}}_c1_median_tpot_ms"] = float(
            latency.loc[latency["layout"] == key, "median_tpot_ms"].iloc[0])
if len(comm):
    metrics["allreduce_median_us_1_token"] = float(comm["median_us"].iloc[0])
publish("09_tp_vs_replicas", metrics=metrics,
        tags={{"experiment_parent_run_id": result.parent_run_id}},
        figures={{"throughput": fig_tput, "tpot_ecdf": fig_tpot}},
        tables={{"layouts": layouts, "latency": latency, "allreduce": comm}},
        params={{"model": model, "num_workers": workers, "concurrency": concurrency}},
        {PUBLISH_KW})
metrics'''),
    ("md", f"""## What the numbers show, and what they do not

- **Throughput:** on this machine two replicas beat TP=2 by a wide margin, and TP=2 is
  usually *slower than one worker* (scaling efficiency below 0.5). That is not a bug in the
  TP path (`tests/distributed` proves its tokens equal TP=1's); it is the arithmetic of
  section 4: the demo model's decode step is a few milliseconds of compute at most, while
  each of its 2L + 2 = 14 gloo all-reduces over loopback TCP costs a few hundred
  microseconds at the median and up to milliseconds in the tail on two shared cores.
  Halving the compute cannot pay for that.
- **TPOT:** even at concurrency 1 (section 3) TP=2 does not win here: its step is one
  worker's step (halved compute) plus the collectives. The isolated floor of section 4 is
  only part of what TP adds in the engine (the line printed under the table compares the
  two): inside a step each collective also waits for the slower rank, and with both ranks,
  the router and the load generator on two cores a rank is often descheduled just when the
  other needs it. A shared-memory all-reduce (what vLLM's CPU backend uses instead of gloo)
  would lower the floor; it is not built here. TP wins the latency side when one step's
  compute divided by N exceeds the collectives' cost: large models (weights that must be
  split to fit, or the memory bandwidth of N devices), long prefills, fast interconnects
  (an NVLink all-reduce takes microseconds).
- **Replicas:** scale as long as the requests are independent and the router balances them;
  their efficiency here is below 1 because the two replicas, the router, the load generator
  and the notebook share two cores. What replicas cannot do is serve a model larger than one
  worker's memory, or cut the latency of one request.
- **Noise:** one repeat per layout on shared cores; raise `repeats` (the template uses 3)
  before trusting differences of a few percent. A factor of two is not noise.
- **Not shown:** NCCL on GPUs, TP across nodes, TP combined with replicas (4 workers as 2
  replicas of TP=2: `num_workers: 4`), memory per rank (`llm.engine.runner.memory_per_rank()`
  shows the KV and weights each rank holds).

**The same code on real hardware.** On a multi-GPU node, `tensor_parallel_size=N` spawns one
worker per GPU and the collectives run over NCCL (`device="cuda"`); `workbench router
--num-workers 8 --tensor-parallel-size 2` gives four TP=2 replicas. Across nodes, launch the
engine under `torchrun` with `distributed_executor_backend="external_launcher"` (every rank
runs the same deterministic engine). See the README's "Tensor parallelism and replicas".

{CPU_CAVEAT}"""),
]


# --------------------------------------------------------------------------- 10 routing
ROUTING = [
    ("md", """# 10 · Replicas and routing: round-robin vs prefix-aware on shared-prefix traffic

**Question:** two independent engines (`workbench serve` replicas, one thread each) behind
`workbench router`: on traffic whose requests share long prefixes, does prefix-aware routing
(a request goes to the replica that owns the hash of its first 4 blocks, unless that replica
is overloaded) raise the replicas' prefix-cache hit rate and cut TTFT against round-robin?
And how much of two replicas' ideal 2x does this machine give (scaling efficiency =
throughput_N / (N x throughput_1))?

The experiment is `experiments/routing_policy.yaml` (run here with smaller numbers): baseline
`policy: round_robin`, variable `policy: prefix_aware`, the router and its replicas started
afresh for every run, the same seeded traffic each time. Each replica has its own KV pool and
prefix cache, so *where* a request lands decides whether its prefix is already cached."""),
    ("params", f'''\
model = "demo"                  # trained demo target; "bundled": a random tiny Llama
template_file = ""              # empty: experiments/routing_policy.yaml of this checkout
num_replicas = 2
num_requests = 30               # shared-prefix requests per run
num_prefix_groups = 15          # odd: round-robin sends a group's two requests to two replicas
prefix_len = 768                # tokens of each group's shared prefix
rate = 8.0                      # Poisson arrivals, requests/s
repeats = 1                     # runs per policy (baseline included), interleaved
port = 8124                     # the router's port (the scaling runs use port + 1)
scaling_requests = 16           # balanced-chat requests for 1 vs N replicas; 0 skips it
scaling_concurrency = 8         # closed loop
seed = 0
experiment = "nb-routing-policy"   # MLflow experiment of the runs
{TRACKING}'''),
    ("code", '''\
%matplotlib inline
from pathlib import Path

import pandas as pd
import yaml
from IPython.display import Markdown, display

import workbench
from workbench.analysis import bar_compare, latency_ecdf
from workbench.analysis.frames import run_artifact_frame
from workbench.analysis.notebook import ensure_experiment, publish, resolve_tracking_uri
from workbench.harness.arrivals import ArrivalSpec
from workbench.harness.workloads import make_workload
from workbench.experiments.runner import run_experiment
from workbench.experiments.template import parse_template
from workbench.models.tokenizer import load_tokenizer
from workbench.named_models import resolve_model
from workbench.router.experiment import local_target, run_replica_summary, scaling

path = Path(template_file) if template_file else (
    Path(workbench.__file__).resolve().parents[1] / "experiments" / "routing_policy.yaml")
raw = yaml.safe_load(path.read_text())
raw["name"] = experiment
raw["workload"]["seed"] = seed
raw["workload"]["params"].update(num_requests=num_requests, num_prefix_groups=num_prefix_groups,
                                 prefix_len=prefix_len, max_input_len=prefix_len + 128)
raw["arrivals"] = {"mode": "poisson", "rate": rate, "seed": seed}
raw["repeats"] = repeats
raw["target"] = local_target(raw["target"], port=port, num_replicas=num_replicas, model=model)
template = parse_template(raw)
uri = resolve_tracking_uri(mlflow_uri)  # empty: a throwaway temp sqlite store
print("router command:", " ".join(template.target["command"][1:]))
print("MLflow store:", uri)'''),
    ("md", "## 1. The experiment: round-robin (baseline) vs prefix-aware\n\nThe verdict "
           "table compares medians over repeats; with one repeat there is no noise band, so "
           "read it as a smoke test of the method, not a decision."),
    ("code", '''\
ensure_experiment(template.name, uri)
result = run_experiment(template, uri=uri)
display(Markdown(result.table))'''),
    ("md", "Per run: client TTFT, and from the replicas' own counters (the router re-exports "
           "each replica's `/metrics` and their aggregate) the prefix-cache hit rate in "
           "tokens, hits / queries."),
    ("code", '''\
rows, replica_rows, requests = [], [], {}
for r in result.runs:
    if r.error:
        print(f"{r.label} repeat {r.repeat} failed: {r.error}")
        continue
    policy = template.baseline["policy"] if r.value is None else r.value
    summary = run_replica_summary(r.run_id, uri)
    total = summary[-1]
    rows.append({"policy": policy, "repeat": r.repeat,
                 "median_ttft_ms": r.metrics["median_ttft_ms"],
                 "p95_ttft_ms": r.metrics["p95_ttft_ms"],
                 "output_throughput": r.metrics["output_throughput"],
                 "prefix_hit_rate": total["prefix_hit_rate"],
                 "server_mean_ttft_ms": total["mean_ttft_ms"], "valid": r.valid})
    replica_rows += [{"policy": policy, "repeat": r.repeat, **row} for row in summary]
    requests[f"{policy}, repeat {r.repeat}"] = run_artifact_frame(r.run_id, "requests.csv", uri)
runs = pd.DataFrame(rows)
replicas = pd.DataFrame(replica_rows)
runs'''),
    ("code", '''\
replicas[["policy", "repeat", "replica", "requests", "finished", "prefix_cache_hits",
          "prefix_cache_queries", "prefix_hit_rate", "mean_ttft_ms", "retries", "failures"]]'''),
    ("code", '''\
fig_ttft = latency_ecdf(requests, "ttft_ms")
fig_ttft'''),
    ("code", '''\
fig_hits = bar_compare(replicas, x="replica", y="prefix_hit_rate", hue="policy",
                       title="prefix-cache hit rate (tokens), per replica and all")
fig_hits'''),
    ("md", "## 2. Scaling efficiency: 1 replica vs N on the same closed loop\n\n"
           "Balanced-chat traffic (64 prompt / 32 output tokens each), round-robin, "
           "`scaling_concurrency` clients; output throughput with 1 replica and with "
           "`num_replicas`, and `calc.scaling_efficiency`."),
    ("code", '''\
scale = {}
if scaling_requests:
    wl = make_workload("balanced-chat", seed, load_tokenizer(resolve_model(model)),
                       num_requests=scaling_requests, input_len={"kind": "fixed", "value": 64},
                       output_len={"kind": "fixed", "value": 32})
    scale = scaling(local_target(template.target, port=port + 1), template.baseline, wl,
                    ArrivalSpec(mode="closed", concurrency=scaling_concurrency), num_replicas)
scale_table = pd.DataFrame([scale])
scale_table'''),
    ("code", f'''\
metrics = {{f"{{p}}_{{k}}": float(g[k].median()) for p, g in runs.groupby("policy")
           for k in ("median_ttft_ms", "p95_ttft_ms", "prefix_hit_rate")}}
metrics.update({{k: float(v) for k, v in scale.items() if k in (
    "throughput_1", "throughput_n", "scaling_efficiency")}})
publish("10_routing", metrics=metrics,
        tags={{"experiment_parent_run_id": result.parent_run_id}},
        figures={{"ttft_ecdf": fig_ttft, "hit_rate": fig_hits}},
        tables={{"runs": runs, "replicas": replicas, "scaling": scale_table}},
        params={{"model": model, "num_replicas": num_replicas, "prefix_len": prefix_len}},
        {PUBLISH_KW})'''),
    ("md", f"""## What the numbers show, and what they do not

- **Hit rate** is the mechanism, and it is exact: with an odd number of groups, round-robin
  puts the two requests of every group on different replicas, so no request finds its prefix
  cached (0%); prefix-aware sends the second request of a group to the replica that served
  the first, which then reuses the whole prefix: at most groups x prefix_len hit tokens
  (15 x 768, about 47% of the prompt tokens with the defaults), fewer when the load bound sent
  a second request to the other replica because the owner had 2+ more requests in flight
  (the router counts those in `router_routing_decisions_total{{reason="load_bound"}}`).
  The per-replica rows show that both replicas took a share of the groups (a new prefix goes
  to the least-loaded replica).
- **TTFT** follows from it here because prefill is the expensive part on this CPU: a hit skips
  most of a long prompt's prefill, and at this arrival rate round-robin's extra prefill work
  also queues the requests behind it, so the TTFT gap is larger than the prefill saved per
  request. Lower the rate or the prefix length and the gap shrinks; the hit rate does not.
- **Scaling efficiency** on a 2-core machine says little about replicas in general: two
  one-thread replicas share two cores with the router, the load generator and whatever else
  runs, so two replicas can even be *slower* than one (efficiency well below 0.5). On
  separate GPUs the same number measures the router's overhead and the load balance instead.
- **Noise:** one repeat per policy, on cores other processes also use; the verdict's "beyond
  noise" has no noise band to go by. Raise `repeats` (the template uses 3) before believing a
  TTFT difference of a few percent; a hit rate of 0 against 0.4 is not noise.
- **Not shown:** replica failure and retry (the router resumes a broken stream on another
  replica; `tests/router` kills one mid-run), cache eviction under memory pressure, chat
  traffic whose shared part is a system prompt, and any GPU.

{CPU_CAVEAT}"""),
]

# --------------------------------------------------------------------------- parameter checks
# The first statement of the cell after each `parameters` cell (after papermill's injected
# cell): wrong types and ranges stop the notebook there, naming the parameter
# (workbench.notebook_params). Every parameter of the cell has a spec (tests/test_notebooks.py).
_CHECK = ("from workbench.notebook_params import {names}\n\n"
          "check_params(\n    globals(),\n{specs}    **TRACKING,\n)\n")
_SPECS: dict[str, dict[str, str]] = {
    "01_quickstart.ipynb": {
        "model": "Model()", "num_prompts": "Int(min=1)", "max_tokens": "Int(min=1)",
        "workload": "Fixture()", "num_requests": "Int(min=1)", "concurrency": "Int(min=1)",
        "max_num_batched_tokens": "Int(min=1)", "seed": "Int(min=0)"},
    "02_memory_budget.ipynb": {
        "model": "Model()", "available_mib": "Float(min=0, min_open=True)",
        "activation_mib": "Float(min=0)", "headroom_mib": "Float(min=0)",
        "block_size": "Int(choices=BLOCK_SIZES)", "max_model_len": "Int(min=2)",
        "block_sizes": "List(Int(choices=BLOCK_SIZES))", "max_model_lens": "List(Int(min=2))"},
    "03_chunked_prefill_sweep.ipynb": {
        "model": "Model()", "baseline_budget": "Int(min=1)", "budgets": "List(Int(min=1))",
        "num_requests": "Int(min=1)", "rate": "Float(min=0, min_open=True)",
        "repeats": "Int(min=1)", "seed": "Int(min=0)", "experiment": "Str(nonempty=True)"},
    "04_prefix_caching.ipynb": {
        "model": "Model()", "num_requests": "Int(min=1)", "num_prefix_groups": "Int(min=1)",
        "prefix_len": "Int(min=1)", "concurrency": "Int(min=1)",
        "cache_states": "List(Str(choices=CACHE_STATES))", "caching": "List(Bool())",
        "seed": "Int(min=0)"},
    "05_saturation.ipynb": {
        "model": "Model()", "workload": "Fixture()", "num_requests": "Int(min=1)",
        "concurrencies": "List(Int(min=1))", "max_num_seqs": "Int(min=1)",
        "repeats": "Int(min=1)", "seed": "Int(min=0)"},
    "06_compare_runs.ipynb": {
        "parent_run_id": "Str()", "template_path": "Str(nonempty=True)",
        "values": "List(min_len=0)", "repeats": "Int(min=1)", "num_requests": "Int(min=1)",
        "compare_metrics": "List(Str(nonempty=True))",
        "noise": 'Str(choices=("", "spread", "bootstrap"))'},
    "07_speculative_decoding.ipynb": {
        "model": "Model()", "method": 'Str(choices=("ngram", "draft_model"))',
        "draft_model": "Model()", "num_speculative_tokens": "Int(min=0, max=32)",
        "concurrencies": "List(Int(min=1))", "num_requests": "Int(min=1)",
        "runs": "Int(min=1)", "seed": "Int(min=0)"},
    "08_quantization.ipynb": {
        "model": "Model()", "variants": "List(Str(choices=QUANT_VARIANTS))",
        "int4_group_size": "Int(choices=(32, 64, 128))", "concurrencies": "List(Int(min=1))",
        "rounds": "Int(min=1)", "input_len": "Int(min=1)", "output_len": "Int(min=1)",
        "memory_budget_mib": "Float(min=0, min_open=True)", "quality_prompts": "Int(min=1)",
        "quality_max_tokens": "Int(min=1)", "ppl_tokens": "Int(min=2)", "gate": "Dict()",
        "seed": "Int(min=0)"},
    "09_tp_vs_replicas.ipynb": {
        "model": "Model()", "template_file": "Str()", "num_requests": "Int(min=1)",
        "concurrency": "Int(min=1)", "repeats": "Int(min=1)", "latency_requests": "Int(min=0)",
        "allreduce_iters": "Int(min=0)", "port": "Int(min=1, max=65535)",
        "seed": "Int(min=0)", "experiment": "Str(nonempty=True)"},
    "10_routing.ipynb": {
        "model": "Model()", "template_file": "Str()", "num_replicas": "Int(min=1)",
        "num_requests": "Int(min=1)", "num_prefix_groups": "Int(min=1)",
        "prefix_len": "Int(min=1)", "rate": "Float(min=0, min_open=True)",
        "repeats": "Int(min=1)", "port": "Int(min=1, max=65535)",
        "scaling_requests": "Int(min=0)", "scaling_concurrency": "Int(min=1)",
        "seed": "Int(min=0)", "experiment": "Str(nonempty=True)"},
}
_SPEC_NAMES = ("TRACKING", "BLOCK_SIZES", "CACHE_STATES", "QUANT_VARIANTS", "Bool", "Dict",
               "Fixture", "Float", "Int", "List", "Model", "Str", "check_params")


def check_cell(name: str) -> str:
    """The parameter check that opens the cell after `name`'s parameters cell."""
    specs = _SPECS[name]
    text = "".join(f"    {k}={v},\n" for k, v in specs.items())
    used = [n for n in _SPEC_NAMES if n in ("TRACKING", "check_params")
            or any(re.search(rf"\b{n}\b", v) for v in specs.values())]
    names = textwrap.fill(", ".join(used), 92, initial_indent="    ", subsequent_indent="    ")
    return _CHECK.format(names=f"(\n{names},\n)", specs=text)


NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_memory_budget.ipynb": MEMORY,
    "03_chunked_prefill_sweep.ipynb": CHUNKED,
    "04_prefix_caching.ipynb": PREFIX,
    "05_saturation.ipynb": SATURATION,
    "06_compare_runs.ipynb": COMPARE,
    "07_speculative_decoding.ipynb": SPECULATIVE,
    "08_quantization.ipynb": QUANTIZATION,
    "09_tp_vs_replicas.ipynb": TP_VS_REPLICAS,
    "10_routing.ipynb": ROUTING,
}


def build(name: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """One notebook: markdown/code cells, the `parameters` cell tagged for papermill."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    stem = name.split("_")[0]
    check = None
    for i, (kind, source) in enumerate(cells):
        cell_id = f"nb{stem}-{i:02d}"
        if kind == "md":
            cell = nbformat.v4.new_markdown_cell(source, id=cell_id)
        else:
            if check is not None:  # the cell after the parameters cell opens with the check
                source, check = f"{check}\n{source}", None
            cell = nbformat.v4.new_code_cell(source, id=cell_id)
            if kind == "params":
                cell.metadata["tags"] = ["parameters"]
                check = check_cell(name)
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nbformat.write(build(name, cells), HERE / name)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
