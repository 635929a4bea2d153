"""The metric registry: one row per metric with its name, unit, direction and source.

Read by the harness (`workbench.harness.metrics`: which latency families exist, the summary
table's labels and units), the verdict (better / worse), template validation (objective
metric and slo keys, with "did you mean"), the analysis plots (axis labels with units), the
engine's statistics (which counters and gauges it keeps) and the server's Prometheus
collectors (help text and type). Adding a metric is one row here plus its computation;
`tests/metrics/test_registry.py` fails when a computed metric has no row or a row is
never computed.

Two kinds of row:

- a scalar metric (`stats == ()`): the row's name is the metric's name, e.g.
  `output_throughput`;
- a latency family (`stats` set): the name is the family (`ttft`), and the metrics are
  `<stat>_<family>_ms` for each stat: "mean", "median", "std" and "p" (one per requested
  percentile, vLLM's word: p99, p99.9), or a fixed percentile such as "p95". `spec` resolves
  such a name (`p95_ttft_ms`) to a `MetricSpec` of its own.

Directions: "lower" (lower is better), "higher", or "none" (a count or a share that says
nothing good or bad by itself, e.g. `duration`). Sources: "client" (the load generator's
timestamps, vLLM's `vllm bench serve` definitions), "server" (engine timestamps the target
returns per request), "run" (the run's validity and engine step trace), "engine" (the engine's
counters and gauges: `LLM.stats()` and the server's `/metrics`, vLLM's names; `kind` says
which), "prometheus" (the server's `/metrics` histograms, vLLM's names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

DIRECTIONS = ("lower", "higher", "none")
SOURCES = ("client", "server", "run", "engine", "prometheus")
KINDS = ("", "counter", "gauge")  # an engine row's Prometheus type ("" for other sources)
STATS = ("mean", "median", "std", "p")
DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
# Units the summary table prints after a label ("Benchmark duration (s)"); counts do not.
_SHOWN_UNITS = ("s", "ms", "req/s", "tok/s")


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str  # "ms", "s", "req/s", "tok/s", "requests", "tokens", "fraction", "1"
    direction: str  # "lower" | "higher" | "none"
    source: str  # "client" | "server" | "run" | "engine" | "prometheus"
    description: str
    label: str = ""  # vLLM's printed label (summary table), or a family's section header
    abbrev: str = ""  # a latency family's short name ("TTFT")
    stats: tuple[str, ...] = ()  # a latency family's statistics (see the module docstring)
    kind: str = ""  # "counter" | "gauge" for an engine row

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{self.name}: direction {self.direction!r} not in {DIRECTIONS}")
        if self.source not in SOURCES:
            raise ValueError(f"{self.name}: source {self.source!r} not in {SOURCES}")
        if self.kind not in KINDS or (self.source == "engine") != bool(self.kind):
            raise ValueError(f"{self.name}: kind {self.kind!r}: an engine row is a counter "
                             "or a gauge, other rows have none")

    @property
    def is_family(self) -> bool:
        return bool(self.stats)

    @property
    def objective(self) -> str | None:
        """The template's word for this direction: "minimize", "maximize", or None."""
        return {"lower": "minimize", "higher": "maximize"}.get(self.direction)

    @property
    def axis_label(self) -> str:
        """`name (unit)` for a plot axis (unitless shares and counts stay bare)."""
        return self.name if self.unit in ("1", "") else f"{self.name} ({self.unit})"

    @property
    def shown_label(self) -> str:
        """The summary-table label: vLLM's words, with the unit when vLLM prints one."""
        return f"{self.label} ({self.unit})" if self.unit in _SHOWN_UNITS else self.label


def _lat(name: str, abbrev: str, label: str, description: str, source: str = "client",
         stats: tuple[str, ...] = STATS) -> MetricSpec:
    return MetricSpec(name, "ms", "lower", source, description, label, abbrev, stats)


def _engine(name: str, unit: str, direction: str, kind: str, description: str) -> MetricSpec:
    return MetricSpec(name, unit, direction, "engine", description, kind=kind)


_SERVER_STATS = ("mean", "median", "p95")

# The table. Order: vLLM's "Serving Benchmark Result" order, then the rest.
METRICS: tuple[MetricSpec, ...] = (
    # ---- client: vllm/benchmarks/serve.py::calculate_metrics
    MetricSpec("completed", "requests", "higher", "client",
               "Requests that finished successfully.", "Successful requests"),
    MetricSpec("failed", "requests", "lower", "client",
               "Requests that failed (an error or no response).", "Failed requests"),
    MetricSpec("error_rate", "fraction", "lower", "client",
               "failed / all requests (0 for an empty run).", "Error rate"),
    MetricSpec("duration", "s", "none", "client",
               "Wall time of the measured part of the run.", "Benchmark duration"),
    MetricSpec("total_input_tokens", "tokens", "none", "client",
               "Prompt tokens of the successful requests.", "Total input tokens"),
    MetricSpec("total_output_tokens", "tokens", "none", "client",
               "Output tokens (the engine's usage count) of the successful requests.",
               "Total generated tokens"),
    MetricSpec("request_throughput", "req/s", "higher", "client",
               "completed / duration.", "Request throughput"),
    MetricSpec("request_goodput", "req/s", "higher", "client",
               "Successful requests meeting every SLO bound (value <= bound; TPOT counted as "
               "0 for <= 1 output token) / duration; only when an SLO is set.",
               "Request goodput"),
    MetricSpec("output_throughput", "tok/s", "higher", "client",
               "total_output_tokens / duration.", "Output token throughput"),
    MetricSpec("total_token_throughput", "tok/s", "higher", "client",
               "(total_input_tokens + total_output_tokens) / duration.",
               "Total token throughput"),
    _lat("ttft", "TTFT", "Time to First Token",
         "First streamed chunk with content minus send time, per successful request."),
    _lat("tpot", "TPOT", "Time per Output Token (excl. 1st token)",
         "(E2EL - TTFT) / (output_tokens - 1), successful requests with > 1 output token."),
    _lat("itl", "ITL", "Inter-token Latency",
         "Every gap between consecutive streamed chunks, pooled over successful requests."),
    _lat("e2el", "E2EL", "End-to-end Latency",
         "Last content chunk (or end of response) minus send time, per successful request."),
    # ---- server: engine timestamps per request, when the target reports them
    _lat("server_queue", "server queue", "Server: queue (arrival -> scheduled)",
         "Engine arrival -> first scheduled.", "server", _SERVER_STATS),
    _lat("server_prefill", "server prefill", "Server: prefill (scheduled -> first token)",
         "Engine first scheduled -> first token.", "server", _SERVER_STATS),
    _lat("server_decode", "server decode", "Server: decode (first token -> finished)",
         "Engine first token -> finished.", "server", _SERVER_STATS),
    _lat("server_ttft", "server TTFT", "Server: time to first token",
         "Engine arrival -> first token.", "server", _SERVER_STATS),
    _lat("server_e2e", "server E2E", "Server: end-to-end",
         "Engine arrival -> finished.", "server", _SERVER_STATS),
    _lat("server_kv_transfer", "server KV transfer",
         "Server: KV transfer (read from a prefill instance)",
         "Disaggregated decode: the read of the prompt's KV (wire + copy in); requests that "
         "read KV only.", "server", _SERVER_STATS),
    _lat("server_kv_wait", "server KV wait", "Server: waiting for KV (scheduled -> KV in place)",
         "Disaggregated decode: first scheduled -> the KV in place (queueing on the reader + "
         "the transfer); requests that read KV only.", "server", _SERVER_STATS),
    # ---- run: validity and the engine's step trace
    MetricSpec("valid", "1", "higher", "run",
               "1.0 when the run is valid (client kept its schedule, CPUs undisturbed)."),
    MetricSpec("other_cpu_share", "fraction", "none", "run",
               "Share of the machine's CPUs other processes used during the run."),
    MetricSpec("engine_time_s", "s", "none", "run",
               "Sum of engine step durations (in-process step trace)."),
    MetricSpec("prefill_step_share", "fraction", "none", "run",
               "Share of engine time in steps that carried prefill tokens."),
    MetricSpec("decode_only_step_share", "fraction", "none", "run",
               "Share of engine time in pure-decode steps."),
    # ---- run: the KV cache over the run (harness/cache_metrics.py, engine counter deltas)
    MetricSpec("prefix_cache_hit_rate", "fraction", "higher", "run",
               "Device prefix-cache hit tokens / tokens looked up, over the run."),
    MetricSpec("external_prefix_cache_hit_rate", "fraction", "higher", "run",
               "KV connector hit tokens / tokens looked up, over the run."),
    MetricSpec("kv_host_hit_tokens", "tokens", "none", "run",
               "Tokens loaded from the host KV tier over the run."),
    MetricSpec("kv_disk_hit_tokens", "tokens", "none", "run",
               "Tokens loaded from the disk KV tier over the run."),
    MetricSpec("kv_load_bytes", "bytes", "none", "run",
               "KV bytes copied into the device cache from external tiers over the run."),
    MetricSpec("kv_store_bytes", "bytes", "none", "run",
               "KV bytes copied from the device cache to the host tier over the run."),
    MetricSpec("kv_transfer_time_share", "fraction", "lower", "run",
               "KV load + store + swap-out seconds / engine time, over the run."),
    MetricSpec("num_preemptions", "requests", "lower", "run",
               "Preemptions during the run."),
    # ---- engine: counters and gauges (LLM.stats(), the server's /metrics; vLLM's names)
    _engine("vllm:num_preemptions", "requests", "lower", "counter",
            "Cumulative number of preemptions (a request's blocks freed to make room)."),
    _engine("vllm:prefix_cache_queries", "tokens", "none", "counter",
            "Prefix-cache queries: prompt tokens looked up."),
    _engine("vllm:prefix_cache_hits", "tokens", "none", "counter",
            "Prefix-cache hits: prompt tokens served from cached blocks."),
    _engine("vllm:prompt_tokens", "tokens", "none", "counter", "Prefill tokens processed."),
    _engine("vllm:generation_tokens", "tokens", "none", "counter",
            "Generation tokens processed."),
    _engine("vllm:request_success", "requests", "none", "counter",
            "Finished requests by finish reason (stop, length, abort, error)."),
    _engine("vllm:spec_decode_num_drafts", "1", "none", "counter",
            "Speculative decoding: verification steps that carried drafts."),
    _engine("vllm:spec_decode_num_draft_tokens", "tokens", "none", "counter",
            "Speculative decoding: draft tokens proposed."),
    _engine("vllm:spec_decode_num_accepted_tokens", "tokens", "higher", "counter",
            "Speculative decoding: draft tokens accepted."),
    _engine("vllm:spec_decode_num_accepted_tokens_per_pos", "tokens", "none", "counter",
            "Speculative decoding: accepted tokens per draft position."),
    # KV connector (kv_transfer_config): vLLM's names where it has them
    _engine("vllm:external_prefix_cache_queries", "tokens", "none", "counter",
            "KV connector prefix lookups: tokens of the requests looked up externally."),
    _engine("vllm:external_prefix_cache_hits", "tokens", "none", "counter",
            "KV connector hits: tokens loaded from an external tier instead of computed."),
    _engine("vllm:kv_offload_load_bytes", "bytes", "none", "counter",
            "KV offload: bytes copied into the device KV cache from the external tiers."),
    _engine("vllm:kv_offload_load_time", "s", "none", "counter",
            "KV offload: seconds spent in those loads (on the loader thread)."),
    _engine("vllm:kv_offload_store_bytes", "bytes", "none", "counter",
            "KV offload: bytes copied from the device KV cache to the host tier."),
    _engine("vllm:kv_offload_store_time", "s", "none", "counter",
            "KV offload: seconds spent in those stores (after each forward)."),
    _engine("vllm:kv_offload_tiering_read_bytes", "bytes", "none", "counter",
            "KV offload, tiering: bytes read from the disk tier."),
    _engine("vllm:kv_offload_tiering_read_time", "s", "none", "counter",
            "KV offload, tiering: seconds reading the disk tier."),
    _engine("workbench:kv_offload_tiering_write_bytes", "bytes", "none", "counter",
            "KV offload, tiering: bytes written through to the disk tier."),
    _engine("workbench:kv_offload_tiering_failed_writes", "files", "lower", "counter",
            "KV offload, tiering: disk writes that failed (a full or dead disk); the block "
            "stays in host memory only, its temporary file removed."),
    _engine("workbench:kv_offload_tiering_bad_files", "files", "lower", "counter",
            "KV offload, tiering: disk files that failed their check (magic, header, length, "
            "sha256 of key + payload): removed, their load failed and recomputed."),
    _engine("workbench:kv_offload_tiering_pruned_files", "files", "none", "counter",
            "KV offload, tiering: files deleted to keep the folder under disk_bytes_to_use."),
    _engine("workbench:kv_offload_host_hits", "tokens", "none", "counter",
            "External hits served from the host tier."),
    _engine("workbench:kv_offload_disk_hits", "tokens", "none", "counter",
            "External hits served from the disk tier."),
    _engine("workbench:kv_offload_failed_loads", "requests", "lower", "counter",
            "Loads that failed (a tier died or a file was bad): those tokens recomputed."),
    _engine("workbench:kv_offload_store_skipped", "1", "none", "counter",
            "Blocks not offloaded: every host slot pinned or pending."),
    _engine("workbench:kv_swap_out_blocks", "blocks", "none", "counter",
            "preemption_mode=swap: device blocks written to the host tier at preemption."),
    _engine("workbench:kv_swap_in_blocks", "blocks", "none", "counter",
            "preemption_mode=swap: device blocks read back when a swapped request resumes."),
    _engine("workbench:kv_swap_fallbacks", "requests", "none", "counter",
            "preemption_mode=swap: preemptions that recomputed (no host room)."),
    _engine("workbench:kv_swap_out_bytes", "bytes", "none", "counter",
            "preemption_mode=swap: bytes swapped out."),
    _engine("workbench:kv_swap_out_time", "s", "none", "counter",
            "preemption_mode=swap: seconds swapping out (before the forward)."),
    # P2pConnector (prefill/decode disaggregation): the KV handed between instances
    _engine("workbench:kv_transfer_recv_bytes", "bytes", "none", "counter",
            "Disaggregation, decode side: KV bytes read from prefill instances."),
    _engine("workbench:kv_transfer_recv_time", "s", "none", "counter",
            "Disaggregation, decode side: seconds reading them (wire + copy in)."),
    _engine("workbench:kv_transfer_recv_tokens", "tokens", "none", "counter",
            "Disaggregation, decode side: prompt tokens read instead of computed."),
    _engine("workbench:kv_transfer_recv_queries", "requests", "none", "counter",
            "Disaggregation, decode side: requests that came with a prefill handshake."),
    _engine("workbench:kv_transfer_failed_recvs", "requests", "lower", "counter",
            "Disaggregation, decode side: reads that failed (the prompt was recomputed)."),
    _engine("workbench:kv_transfer_send_bytes", "bytes", "none", "counter",
            "Disaggregation, prefill side: KV bytes served to decode instances."),
    _engine("workbench:kv_transfer_send_time", "s", "none", "counter",
            "Disaggregation, prefill side: seconds gathering them for the wire."),
    _engine("workbench:kv_transfer_sends", "requests", "none", "counter",
            "Disaggregation, prefill side: handed-over prefills a decode instance read."),
    _engine("workbench:kv_transfer_send_wait_time", "s", "lower", "counter",
            "Disaggregation, prefill side: their waits, the prefill's end -> the read served "
            "(the KV's queueing between the legs; / kv_transfer_sends = the mean)."),
    _engine("workbench:kv_transfer_held_blocks", "blocks", "none", "counter",
            "Disaggregation, prefill side: blocks held after a prefill for a decode read."),
    _engine("workbench:kv_transfer_expired_sends", "requests", "lower", "counter",
            "Disaggregation, prefill side: holds nobody read within abort_timeout_s."),
    _engine("workbench:kv_transfer_stage_bytes", "bytes", "none", "counter",
            "Disaggregation, layerwise: KV copied to the host send buffer inside the forward."),
    _engine("workbench:kv_transfer_stage_time", "s", "none", "counter",
            "Disaggregation, layerwise: seconds of those copies (on the copy thread/stream)."),
    _engine("workbench:kv_transfer_stage_fallbacks", "requests", "none", "counter",
            "Disaggregation, layerwise: prefill legs without buffer room (their blocks held)."),
    _engine("workbench:kv_transfer_push_bytes", "bytes", "none", "counter",
            "Disaggregation, push, prefill side: KV sent to the decode instance while the "
            "prefill ran."),
    _engine("workbench:kv_transfer_push_time", "s", "none", "counter",
            "Disaggregation, push, prefill side: seconds handing those slices to the wire "
            "(on the copy thread)."),
    _engine("workbench:kv_transfer_push_drops", "requests", "lower", "counter",
            "Disaggregation, push: legs whose push did not arrive whole (decode side not "
            "connected or its inbox full; that read pulls instead)."),
    _engine("workbench:kv_transfer_pushed_loads", "requests", "none", "counter",
            "Disaggregation, push, decode side: loads served from pushed KV (no pull)."),
    _engine("workbench:kv_evicted_blocks", "blocks", "none", "counter",
            "KV compression: blocks released from the middle of requests' tables by the "
            "eviction policy (kv_compression_config)."),
    # The step's overhead account (metrics/step_account.py STEP_PHASES, docs/step_account.md)
    _engine("workbench:step_time_seconds", "s", "none", "counter",
            "Engine steps: seconds in engine.step() (the sum of the phases below)."),
    _engine("workbench:step_schedule_time_seconds", "s", "none", "counter",
            "Engine steps: seconds in scheduler.schedule()."),
    _engine("workbench:step_prepare_inputs_time_seconds", "s", "none", "counter",
            "Engine steps: seconds preparing the forward's inputs (block copies, flat batch)."),
    _engine("workbench:step_forward_time_seconds", "s", "none", "counter",
            "Engine steps: seconds in the model forward only (on CUDA launch time unless "
            "WORKBENCH_SYNC_STEP_TIMING=1)."),
    _engine("workbench:step_sample_time_seconds", "s", "none", "counter",
            "Engine steps: seconds computing logits and sampling (or verifying drafts)."),
    _engine("workbench:step_update_time_seconds", "s", "none", "counter",
            "Engine steps: seconds in update_from_output and the output bookkeeping."),
    _engine("workbench:step_spec_propose_time_seconds", "s", "none", "counter",
            "Engine steps: seconds proposing speculative drafts (0 without speculation)."),
    _engine("workbench:step_other_time_seconds", "s", "none", "counter",
            "Engine steps: the rest of the step time (runner and KV connector glue)."),
    _engine("vllm:num_requests_running", "requests", "none", "gauge",
            "Requests in the running batch after the latest step."),
    _engine("vllm:num_requests_waiting", "requests", "none", "gauge",
            "Requests waiting to be scheduled after the latest step."),
    _engine("vllm:kv_cache_usage_perc", "fraction", "none", "gauge",
            "KV-cache usage: share of the block pool in use (1 = full)."),
    _engine("workbench:num_requests_waiting_for_kv", "requests", "none", "gauge",
            "Requests in WAITING_FOR_REMOTE_KVS (their KV loading) after the latest step."),
    _engine("workbench:kv_offload_cpu_usage_perc", "fraction", "none", "gauge",
            "KV offload: share of the host tier's slots holding blocks."),
    _engine("workbench:kv_transfer_held_requests", "requests", "none", "gauge",
            "Disaggregation, prefill side: finished requests whose blocks await a read."),
    _engine("workbench:kv_blocks_in_use", "blocks", "none", "gauge",
            "KV blocks held by requests after the latest step (KV compression's memory "
            "effect: bounded by the budget per request)."),
    _engine("workbench:step_overhead_share", "fraction", "none", "gauge",
            "Share of engine step time outside the model forward, (step - forward) / step, "
            "over every step so far."),
    # ---- prometheus: the server's /metrics histograms (vLLM's names and help text)
    MetricSpec("vllm:time_to_first_token_seconds", "s", "lower", "prometheus",
               "Time to first token."),
    MetricSpec("vllm:inter_token_latency_seconds", "s", "lower", "prometheus",
               "Inter-token latency."),
    MetricSpec("vllm:request_time_per_output_token_seconds", "s", "lower", "prometheus",
               "Per-request decode time / (generation tokens - 1)."),
    MetricSpec("vllm:e2e_request_latency_seconds", "s", "lower", "prometheus",
               "End-to-end request latency."),
    MetricSpec("vllm:request_queue_time_seconds", "s", "lower", "prometheus",
               "Time in the WAITING phase."),
    MetricSpec("vllm:request_prefill_time_seconds", "s", "lower", "prometheus",
               "Time in the PREFILL phase."),
    MetricSpec("vllm:request_decode_time_seconds", "s", "lower", "prometheus",
               "Time in the DECODE phase."),
    MetricSpec("vllm:request_inference_time_seconds", "s", "lower", "prometheus",
               "Time in the RUNNING phase."),
    MetricSpec("vllm:request_prompt_tokens", "tokens", "none", "prometheus",
               "Prompt tokens per request."),
    MetricSpec("vllm:request_generation_tokens", "tokens", "none", "prometheus",
               "Generation tokens per request."),
    MetricSpec("vllm:request_params_n", "1", "none", "prometheus",
               "The n request parameter."),
    MetricSpec("vllm:request_params_max_tokens", "tokens", "none", "prometheus",
               "The max_tokens request parameter."),
    MetricSpec("vllm:iteration_tokens_total", "tokens", "none", "prometheus",
               "Tokens per engine step."),
)

# Template `slo` keys -> the metric each bounds (the median over repeats must be <= bound).
SLO_BOUNDS: dict[str, str] = {
    "p95_ttft_ms": "p95_ttft_ms", "p95_tpot_ms": "p95_tpot_ms", "p95_itl_ms": "p95_itl_ms",
    "p95_e2el_ms": "p95_e2el_ms", "max_error_rate": "error_rate",
}

_BY_NAME = {m.name: m for m in METRICS}
if len(_BY_NAME) != len(METRICS):  # pragma: no cover - a duplicated row
    raise RuntimeError("metric registry: duplicate names")
_FAMILY_NAME = re.compile(r"^(mean|median|std|p(\d+(?:\.\d+)?))_(.+)_ms$")


def engine_names(kind: str) -> tuple[str, ...]:
    """The engine's counter or gauge names, in table order (what `EngineStats` keeps)."""
    return tuple(m.name for m in METRICS if m.source == "engine" and m.kind == kind)


def percentile_key(q: float) -> str:
    """vLLM's percentile word: 99 -> "99", 99.0 -> "99", 99.9 -> "99.9"."""
    return str(int(q)) if int(q) == q else str(q)


def families(source: str | None = None) -> tuple[MetricSpec, ...]:
    """The latency families (optionally of one source), in table order."""
    return tuple(m for m in METRICS if m.is_family and source in (None, m.source))


def get_family(name: str) -> MetricSpec:
    """The latency family `name` (e.g. "ttft"); KeyError when there is none."""
    row = _BY_NAME.get(name)
    if row is None or not row.is_family:
        raise KeyError(f"{name!r} is not a latency family of the metric registry")
    return row


def family_percentiles(family: MetricSpec, percentiles: Sequence[float]) -> list[float]:
    """The percentiles one family reports: the run's ("p") and any fixed ones ("p95")."""
    fixed = [float(s[1:]) for s in family.stats if s[0] == "p" and s != "p"]
    return (list(percentiles) if "p" in family.stats else []) + fixed


def expand(family: MetricSpec, percentiles: Sequence[float] = DEFAULT_PERCENTILES
           ) -> list[str]:
    """The metric names one family yields: mean_/median_/std_/p<q>_<family>_ms."""
    out = []
    for stat in family.stats:
        if stat == "p":
            out += [f"p{percentile_key(q)}_{family.name}_ms" for q in percentiles]
        else:
            out.append(f"{stat}_{family.name}_ms")
    return out


def metric_names(sources: Iterable[str] = ("client", "server", "run"),
                 percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> list[str]:
    """Every concrete metric name of the given sources (families expanded)."""
    wanted = set(sources)
    out: list[str] = []
    for m in METRICS:
        if m.source in wanted:
            out += expand(m, percentiles) if m.is_family else [m.name]
    return out


def spec(name: str, percentiles: Sequence[float] | None = None) -> MetricSpec | None:
    """The row for a concrete metric name (`p95_ttft_ms` resolves through family `ttft`);
    None when the registry does not know it. With `percentiles`, a "p" statistic must be
    one of them."""
    row = _BY_NAME.get(name)
    if row is not None:
        return None if row.is_family else row
    match = _FAMILY_NAME.match(name)
    if match is None:
        return None
    stat, q, fam = match.group(1), match.group(2), match.group(3)
    family = _BY_NAME.get(fam)
    if family is None or not family.is_family:
        return None
    if q is not None:
        fixed = stat in family.stats
        listed = "p" in family.stats and (percentiles is None or q in {
            percentile_key(p) for p in percentiles})
        if not (fixed or listed):
            return None
        what = f"P{q}"
    elif stat not in family.stats:
        return None
    else:
        what = stat.capitalize()
    return replace(family, name=name, label=f"{what} {family.abbrev}", stats=(),
                   description=f"{what} of {family.abbrev}: {family.description}")


def get(name: str) -> MetricSpec:
    """`spec(name)`, or KeyError naming the closest registered names."""
    row = spec(name)
    if row is None:
        raise KeyError(f"metric {name!r} is not in the metric registry"
                       f"{did_you_mean(name)}")
    return row


def did_you_mean(name: str, known: Sequence[str] | None = None) -> str:
    from workbench.errors import did_you_mean as _dym

    return _dym(name, known if known is not None else metric_names(SOURCES))


def direction(name: str) -> str:
    """"lower" | "higher" | "none" ("none" also for a name the registry does not know)."""
    row = spec(name)
    return "none" if row is None else row.direction


def axis_label(column: str) -> str:
    """A plot axis label: `name (unit)` for a registered metric (an MLflow column such as
    `metrics.p95_ttft_ms` is read by its last part), else the column itself."""
    row = spec(column.split(".", 1)[1] if column.startswith("metrics.") else column)
    return column if row is None else row.axis_label


def markdown_table() -> str:
    """The registry as the markdown table in docs/metrics.md (a family's statistics in
    braces; `pQ` is one metric per requested percentile, vLLM's word: p50, p99.9)."""
    lines = ["| metric | unit | better | source | definition |", "|---|---|---|---|---|"]
    for m in METRICS:
        stats = ",".join("pQ" if s == "p" else s for s in m.stats)
        name = f"`{{{stats}}}_{m.name}_ms`" if m.is_family else f"`{m.name}`"
        lines.append(f"| {name} | {m.unit} | {m.direction} | {m.source} | {m.description} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m workbench.metrics.registry > the table
    print(markdown_table(), end="")
