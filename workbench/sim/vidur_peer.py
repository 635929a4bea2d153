"""Vidur (microsoft/vidur, MLSys 2024) as a peer of the simulator: one synthetic workload, one
GPU, one scheduler budget, predicted on both sides (issue 33, "Against Vidur").

    cfg = VidurCompareConfig(model="Llama-2-7B", hardware="A100-80GB-SXM", qps=4.0)
    Path("trace.csv").write_text(trace_csv(cfg))          # the same arrivals for both sides
    stage_profiles(cfg, data_dir, cache)                   # vidur_data: a checkout's profiles
    args = vidur_args(cfg, trace, out, cache, num_blocks=our_num_blocks(cfg))
    # HF_HUB_OFFLINE=1 python -m vidur.main *args   (its own environment, `make peer-vidur`)
    theirs = parse_request_metrics(find_request_metrics(out).read_text())
    ours = simulate_ours(cfg, our_num_blocks(cfg))

The workload is fixed prompt and output lengths, arrivals from the harness's seeded Poisson
schedule (`arrival_offsets`), replayed by Vidur as a trace (its own Poisson generator caps each
gap at 3 / qps, so the arrivals would differ). Both sides get the same KV pool (our analytic
sizing of the GPU, passed to Vidur as `num_blocks`, watermark 0) and no prefix caching.
Scheduler, in Vidur's terms:

    vllm      Vidur's vLLM (V0) scheduler: prefill-only batches of whole prompts while the
              queue admits (prompt tokens summed <= max_tokens_in_batch), else a decode batch;
              ours: max_num_batched_tokens, chunked prefill off (decodes share the step).
    sarathi   Vidur's Sarathi-Serve: decodes first, then prefill chunks up to chunk_size;
              ours: max_num_batched_tokens = chunk_size, chunked prefill on.

Metrics are the harness's definitions on both sides: TTFT = first token - arrival, TPOT =
(end - first token) / (output tokens - 1); Vidur's request_metrics.csv gives prefill_e2e_time
and request_e2e_time (seconds) per request. Percentiles: numpy's linear, as the harness.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.config import CacheConfig, SchedulerConfig
from workbench.harness.arrivals import ArrivalSpec, arrival_offsets
from workbench.harness.workloads import BenchRequest, Workload
from workbench.sim.cost_model import AnalyticCostModel
from workbench.sim.instance import SIM_TOKEN, SimInstance
from workbench.sim.simulator import simulate
from workbench.sim.vidur_data import dataset_names

# our named shape -> Vidur's model name (its profiling data's folder)
VIDUR_MODELS = {"Llama-2-7B": "meta-llama/Llama-2-7b-hf",
                "Llama-3-8B": "meta-llama/Meta-Llama-3-8B",
                "Llama-3-70B": "meta-llama/Meta-Llama-3-70B"}
# our GPU profile -> Vidur's device and network device (its profiling data's folders)
VIDUR_DEVICES = {"A100-80GB-SXM": ("a100", "a100_pairwise_nvlink"),
                 "H100-SXM": ("h100", "h100_pairwise_nvlink")}
SCHEDULERS = ("vllm", "sarathi")
TRACE_DATE = "2023-08-21"  # any date: the trace's rows and the generator's filter agree
PREDICTORS = ("random_forrest", "linear_regression")  # Vidur's spelling


@dataclass(frozen=True)
class VidurCompareConfig:
    """One comparison: the workload, the GPU and model, the scheduler and its budget."""

    model: str = "Llama-2-7B"
    hardware: str = "A100-80GB-SXM"
    num_requests: int = 256
    qps: float = 4.0
    prompt_tokens: int = 512
    decode_tokens: int = 128  # output tokens per request (the first comes from the prefill)
    seed: int = 0
    scheduler: str = "vllm"
    max_num_seqs: int = 128  # Vidur: batch_size_cap
    max_num_batched_tokens: int = 4096  # Vidur: max_tokens_in_batch (vllm), chunk_size
    block_size: int = 16
    max_model_len: int = 4096  # Vidur: the trace's max_tokens
    predictor: str = "random_forrest"

    def __post_init__(self) -> None:
        for name, allowed in (("model", VIDUR_MODELS), ("hardware", VIDUR_DEVICES),
                              ("scheduler", SCHEDULERS), ("predictor", PREDICTORS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"VidurCompareConfig {name} ({value!r}) must be one of "
                                 f"{', '.join(allowed)}")
        for name in ("num_requests", "prompt_tokens", "max_num_seqs",
                     "max_num_batched_tokens", "block_size", "max_model_len"):
            _need_int(name, getattr(self, name), 1)
        _need_int("decode_tokens", self.decode_tokens, 2)  # a TPOT needs two tokens
        _need_int("seed", self.seed, 0)
        if isinstance(self.qps, bool) or not isinstance(self.qps, int | float) or \
                not 0 < self.qps < float("inf"):
            raise ValueError(f"VidurCompareConfig qps ({self.qps!r}) must be finite and > 0")
        if self.prompt_tokens + self.decode_tokens > self.max_model_len:
            raise ValueError(f"VidurCompareConfig prompt_tokens + decode_tokens "
                             f"({self.prompt_tokens + self.decode_tokens}) must be <= "
                             f"max_model_len ({self.max_model_len})")
        if self.prompt_tokens > self.max_num_batched_tokens and self.scheduler == "vllm":
            raise ValueError(f"VidurCompareConfig prompt_tokens ({self.prompt_tokens}) must "
                             f"be <= max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             "with scheduler 'vllm' (whole prompts, no chunking)")

    @property
    def vidur_model(self) -> str:
        return VIDUR_MODELS[self.model]

    @property
    def vidur_device(self) -> str:
        return VIDUR_DEVICES[self.hardware][0]

    @property
    def vidur_network_device(self) -> str:
        return VIDUR_DEVICES[self.hardware][1]


def _need_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"VidurCompareConfig {name} ({value!r}) must be an integer >= {low}")


def arrival_spec(cfg: VidurCompareConfig) -> ArrivalSpec:
    return ArrivalSpec(mode="poisson", rate=float(cfg.qps), seed=cfg.seed)


def arrival_times(cfg: VidurCompareConfig) -> list[float]:
    """Seconds from the start at which each request arrives (the harness's schedule)."""
    offsets = arrival_offsets(arrival_spec(cfg), cfg.num_requests)
    assert offsets is not None  # an open loop always has a schedule
    return offsets


def trace_csv(cfg: VidurCompareConfig) -> str:
    """The workload as vidur 0.0.26's trace_replay generator reads it (Time in seconds; it
    keeps the rows whose Date is the one it is given, TRACE_DATE)."""
    rows = ["Date,Time,PromptTokenCount,CompletionTokenCount"]
    rows += [f"{TRACE_DATE},{t!r},{cfg.prompt_tokens},{cfg.decode_tokens}"
             for t in arrival_times(cfg)]
    return "\n".join(rows) + "\n"


def vidur_args(cfg: VidurCompareConfig, trace_file: Path, output_dir: Path, cache_dir: Path,
               num_blocks: int) -> list[str]:
    """`python -m vidur.main` arguments for `cfg` (vidur 0.0.26's flat config names); the
    profiles are the datasets `vidur_data.stage_profiles` wrote into `cache_dir`."""
    _need_int("num_blocks", num_blocks, 1)
    sched = f"{cfg.scheduler}_scheduler_config"
    budget = "max_tokens_in_batch" if cfg.scheduler == "vllm" else "chunk_size"
    pred = f"{cfg.predictor}_execution_time_predictor_config"
    compute, network = dataset_names(cfg)
    pairs = [
        ("seed", cfg.seed),
        ("cluster_config_num_replicas", 1),
        ("replica_config_model_name", cfg.vidur_model),
        ("replica_config_device", cfg.vidur_device),
        ("replica_config_network_device", cfg.vidur_network_device),
        ("replica_config_tensor_parallel_size", 1),
        ("replica_config_num_pipeline_stages", 1),
        ("cache_config_block_size", cfg.block_size),
        ("cache_config_num_blocks", num_blocks),
        ("cache_config_watermark_blocks_fraction", 0.0),
        ("global_scheduler_config_type", "round_robin"),
        ("replica_scheduler_config_type", cfg.scheduler),
        (f"{sched}_batch_size_cap", cfg.max_num_seqs),
        (f"{sched}_{budget}", cfg.max_num_batched_tokens),
        ("request_generator_config_type", "trace_replay"),
        ("trace_request_generator_config_trace_file", trace_file),
        ("trace_request_generator_config_max_tokens", cfg.max_model_len),
        ("trace_request_generator_config_date", TRACE_DATE),
        ("trace_request_generator_config_prefill_scale_factor", 1),
        ("trace_request_generator_config_decode_scale_factor", 1),
        ("trace_request_generator_config_time_scale_factor", 1),
        ("execution_time_predictor_config_type", cfg.predictor),
        (f"{pred}_model_profiling_dataset", compute),
        (f"{pred}_network_profiling_dataset", network),
        (f"{pred}_cache_dir", cache_dir),
        (f"{pred}_prediction_max_prefill_chunk_size", cfg.max_num_batched_tokens),
        (f"{pred}_prediction_max_batch_size", cfg.max_num_seqs),
        (f"{pred}_prediction_max_tokens_per_request", cfg.max_model_len),
        ("metrics_config_output_dir", output_dir),
    ]
    args = [item for key, value in pairs for item in (f"--{key}", str(value))]
    return args + ["--no-cache_config_enable_prefix_caching",
                   "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace"]


def our_configs(cfg: VidurCompareConfig) -> tuple[SchedulerConfig, CacheConfig]:
    """Our scheduler and cache knobs for `cfg` (see the module docstring)."""
    sc = SchedulerConfig(max_num_seqs=cfg.max_num_seqs,
                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                         enable_chunked_prefill=cfg.scheduler == "sarathi",
                         max_model_len=cfg.max_model_len)
    return sc, CacheConfig(block_size=cfg.block_size, enable_prefix_caching=False)


def our_num_blocks(cfg: VidurCompareConfig) -> int:
    """The KV pool our analytic target gives this GPU (`sim.target.num_gpu_blocks`)."""
    from workbench.sim.target import num_gpu_blocks

    cost = AnalyticCostModel(cfg.model, cfg.hardware)
    return num_gpu_blocks({"hardware": cfg.hardware}, {}, cost, cfg.block_size)


@dataclass(frozen=True)
class LatencySummary:
    """Predicted latencies of one side, in milliseconds."""

    num_requests: int
    median_ttft_ms: float
    p95_ttft_ms: float
    median_tpot_ms: float

    @classmethod
    def from_series(cls, ttft_s: list[float], tpot_s: list[float]) -> LatencySummary:
        if not ttft_s or len(ttft_s) != len(tpot_s):
            raise ValueError(f"LatencySummary needs one TTFT and one TPOT per request "
                             f"(got {len(ttft_s)} and {len(tpot_s)})")
        return cls(len(ttft_s), float(np.median(ttft_s)) * 1e3,
                   float(np.percentile(ttft_s, 95)) * 1e3, float(np.median(tpot_s)) * 1e3)


def simulate_ours(cfg: VidurCompareConfig, num_blocks: int) -> LatencySummary:
    """Our simulator on `cfg`: the analytic cost model of the GPU, no step noise."""
    sc, cc = our_configs(cfg)
    inst = SimInstance("instance0", sc, cc, num_blocks,
                       AnalyticCostModel(cfg.model, cfg.hardware), step_noise=0.0)
    workload = Workload("vidur-compare", cfg.seed, {}, tuple(
        BenchRequest(f"r{i}", [SIM_TOKEN] * cfg.prompt_tokens, cfg.decode_tokens)
        for i in range(cfg.num_requests)))
    result = simulate(workload, arrival_spec(cfg), [inst])
    failed = [r.request_id for r in result.records if not r.success]
    if failed:
        raise RuntimeError(f"our simulator failed {len(failed)} request(s): {failed[:3]}")
    ttft = [r.ttft_s for r in result.records]
    tpot = [r.tpot_s for r in result.records]
    if any(v is None for v in ttft + tpot):
        raise RuntimeError("our simulator left a request without a TTFT or TPOT")
    return LatencySummary.from_series([float(v) for v in ttft if v is not None],
                                      [float(v) for v in tpot if v is not None])


REQUEST_METRICS_COLUMNS = ("Request Id", "request_e2e_time", "prefill_e2e_time",
                           "request_num_decode_tokens")


def parse_request_metrics(text: str) -> LatencySummary:
    """Vidur's request_metrics.csv (one row per request, times in seconds) as a summary:
    TTFT = prefill_e2e_time, TPOT = (request_e2e_time - prefill_e2e_time) / (decode - 1)."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUEST_METRICS_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"Vidur request metrics lack column(s) {', '.join(missing)} "
                         f"(columns: {', '.join(reader.fieldnames or [])})")
    ttft, tpot = [], []
    for row in reader:
        rid = row["Request Id"]
        try:
            e2e, first = float(row["request_e2e_time"]), float(row["prefill_e2e_time"])
            decode = int(float(row["request_num_decode_tokens"]))
        except ValueError:
            raise ValueError(f"Vidur request {rid}: a time or token count is not a number "
                             f"({row})") from None
        if decode < 2 or not 0 <= first <= e2e:
            raise ValueError(f"Vidur request {rid}: need decode tokens >= 2 and 0 <= "
                             f"prefill_e2e_time <= request_e2e_time (got {decode}, {first}, "
                             f"{e2e})")
        ttft.append(first)
        tpot.append((e2e - first) / (decode - 1))
    if not ttft:
        raise ValueError("Vidur request metrics hold no request")
    return LatencySummary.from_series(ttft, tpot)


def find_request_metrics(output_dir: Path) -> Path:
    """The request_metrics.csv of the one run Vidur wrote under `output_dir` (it adds a
    timestamped folder)."""
    found = sorted(output_dir.glob("*/request_metrics.csv"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one <timestamp>/request_metrics.csv under "
                                f"{output_dir}, found {len(found)}")
    return found[0]


def comparison_table(ours: LatencySummary, theirs: LatencySummary) -> str:
    """Markdown: each metric, ours, Vidur's, and ours / Vidur."""
    lines = ["| metric | ours | Vidur | ours / Vidur |", "|---|---:|---:|---:|"]
    for name, label in (("median_ttft_ms", "median TTFT (ms)"),
                        ("p95_ttft_ms", "p95 TTFT (ms)"),
                        ("median_tpot_ms", "median TPOT (ms)")):
        a, b = getattr(ours, name), getattr(theirs, name)
        ratio = f"{a / b:.2f}" if b > 0 else "n/a"
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {ratio} |")
    return "\n".join(lines)
