"""Engine configuration: dataclasses with vLLM's knob names, validated on construction.

`EngineConfig.from_kwargs(**LLM kwargs)` splits the flat `LLM(...)` keywords into the
sub-configs below; each sub-config checks its own fields in `__post_init__` and raises one
`ValueError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from workbench.compilation_config import CompilationConfig, CompilationMode, default_mode
from workbench.compile_choice import measured_default
from workbench.kv_transfer_config import PREEMPTION_MODES, KVTransferConfig
from workbench.models.registry import SUPPORTED_ARCHITECTURES
from workbench.named_models import resolve_model
from workbench.ray_utils import CLUSTER_EXTRA, ray_installed

_DTYPES = ("auto", "float32", "bfloat16", "float16")
# The policies `workbench.engine.request_queue.REQUEST_QUEUES` implements (a test keeps the two
# equal): the names SchedulerConfig accepts.
SCHEDULING_POLICIES = ("fcfs", "priority")
QUANTIZATION_METHODS = ("int8", "int4", "fp8")
INT4_GROUP_SIZES = (32, 64, 128)
logger = logging.getLogger(__name__)
DEFAULT_INT4_GROUP_SIZE = 128  # GPTQ's / AWQ's usual group_size



def knob(default: Any, help: str) -> Any:  # noqa: A002 - argparse's word
    """A config field that is an engine knob: its default and its one-line help, which
    `workbench.engine_args` turns into the command-line flags' help."""
    return field(default=default, metadata={"help": help})

@dataclass(frozen=True)
class QuantConfig:
    """Online weight quantization of the linear layers, applied right after loading.

    "int8" = W8A16 (per-output-channel symmetric), "int4" = W4A16 (asymmetric per group of
    `group_size` input features, two values per byte), "fp8" = W8A8 e4m3 (per-channel weight
    scales, dynamic per-token activation scales). The embeddings, lm_head and norms stay in the
    model dtype, as with vLLM's defaults. Built from ModelConfig's `quantization` and
    `quantization_group_size` knobs (the names in error messages).
    """

    method: str | None = None  # None | "int8" | "int4" | "fp8"
    group_size: int | None = None  # int4 only: 32 | 64 | 128; None -> 128 for int4

    def __post_init__(self) -> None:
        m, g = self.method, self.group_size
        if m is not None and m not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization ({m!r}) must be None or one of "
                f"{', '.join(repr(q) for q in QUANTIZATION_METHODS)}"
            )
        if g is not None and m != "int4":
            raise ValueError(
                f"quantization_group_size ({g!r}) only applies to quantization='int4' "
                f"(got quantization={m!r}); leave it unset"
            )
        if m == "int4":
            if g is None:
                object.__setattr__(self, "group_size", DEFAULT_INT4_GROUP_SIZE)
            elif isinstance(g, bool) or g not in INT4_GROUP_SIZES:
                raise ValueError(
                    f"quantization_group_size ({g!r}) must be one of "
                    f"{', '.join(map(str, INT4_GROUP_SIZES))}"
                )

    def options(self) -> dict[str, Any]:
        """Keyword options for `quantize_model` (group_size for int4, none otherwise)."""
        return {"group_size": self.group_size} if self.method == "int4" else {}


@dataclass
class ModelConfig:
    """The model folder and its Hugging Face `config.json`."""

    model: str
    dtype: str = knob("auto", "weights and activations: auto (float32 on CPU, bfloat16 on "
                      "CUDA) | float32 | bfloat16 | float16")
    max_model_len: int | None = knob(None, "longest prompt + output in tokens (default: the "
                                           "model's max_position_embeddings)")
    seed: int = knob(0, "seed of the engine's sampling generator")
    quantization: str | None = knob(None, "quantize the linear weights at load time: int8 "
                                          "(W8A16) | int4 (W4A16) | fp8 (W8A8)")
    quantization_group_size: int | None = knob(None, "int4 only: 32 | 64 | 128 input "
                                                     "features per scale (default 128)")
    hf_config: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _ = self.quant_config  # validates quantization / quantization_group_size
        self.model = resolve_model(self.model)
        path = Path(self.model)
        if not path.is_dir():
            raise ValueError(
                f"model ({self.model!r}) is not a folder; pass a local Hugging Face folder with "
                "config.json, *.safetensors and tokenizer files (nothing is downloaded)"
            )
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"model ({self.model!r}) has no config.json")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype ({self.dtype!r}) must be one of {', '.join(_DTYPES)}")
        self.hf_config = json.loads(cfg_path.read_text())
        archs = self.hf_config.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture ({arch!r}) in {cfg_path} is not supported; supported "
                f"architectures are {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        max_pos = int(self.hf_config.get("max_position_embeddings", 2048))
        if self.max_model_len is None:
            self.max_model_len = max_pos
        elif not isinstance(self.max_model_len, int) or self.max_model_len < 1:
            raise ValueError(f"max_model_len ({self.max_model_len}) must be a positive integer")
        elif self.max_model_len > max_pos:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must be <= the model's "
                f"max_position_embeddings ({max_pos})"
            )

    @property
    def quant_config(self) -> QuantConfig:
        return QuantConfig(self.quantization, self.quantization_group_size)

    @property
    def architecture(self) -> str:
        return self.hf_config["architectures"][0]

    @property
    def num_layers(self) -> int:
        return int(self.hf_config["num_hidden_layers"])

    @property
    def num_attention_heads(self) -> int:
        return int(self.hf_config["num_attention_heads"])

    @property
    def num_kv_heads(self) -> int:
        return int(self.hf_config.get("num_key_value_heads") or self.num_attention_heads)

    @property
    def head_dim(self) -> int:
        hd = self.hf_config.get("head_dim")
        return int(hd) if hd else int(self.hf_config["hidden_size"]) // self.num_attention_heads

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.hf_config.get("eos_token_id")
        if eos is None:
            return []
        return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "fp8" is e4m3, as in vLLM; "auto" = model dtype


@dataclass
class CacheConfig:
    """The paged KV cache and the memory budget it is sized from.

    Pool size, first match wins: `num_gpu_blocks_override` (blocks), `kv_cache_memory_bytes`
    (KV bytes), a whole-process budget (`cpu_memory_budget_bytes` on CPU,
    `gpu_memory_utilization` x device memory on CUDA: KV = budget - weights - measured
    activation peak - reserve, see `LLMEngine._size_kv_pool`), else a default (enough for
    max_num_seqs requests of max_model_len, at most 4 GiB). The budget knobs cannot be combined
    with the two direct ones.

    `kv_cache_dtype="fp8"` (alias "fp8_e4m3") stores K and V as float8_e4m3fn with one scale
    per layer for K and one for V (k_scale, v_scale; 1.0 by default, as vLLM): writes store
    clamp(x / scale, -448, 448) as e4m3, attention reads fp8 * scale. `calculate_kv_scales=True`
    sets each layer's scales from its first forward instead: scale = amax(|x|) / 448.
    """

    block_size: int = knob(16, "tokens per KV block")
    enable_prefix_caching: bool = knob(True, "reuse the KV of full blocks with the same "
                                             "prefix (hash chain)")
    num_gpu_blocks_override: int | None = knob(None, "force the KV pool size in blocks")
    kv_cache_memory_bytes: int | None = knob(None, "size the KV pool from a KV byte budget")
    kv_cache_dtype: str = knob("auto", "auto (the model dtype) | fp8 | fp8_e4m3")
    calculate_kv_scales: bool = knob(False, "fp8 KV: scales = amax / 448 from the first "
                                            "forward (else 1.0)")
    # Whole-process budgets (weights + KV + activation peak + reserve); KV gets the rest.
    cpu_memory_budget_bytes: int | None = knob(None, "device cpu: the whole process's budget "
                                                     "in bytes; KV gets what the weights, the "
                                                     "activation peak and the reserve leave")
    # vLLM's default is 0.9; None keeps the demand-sized default pool so tests and notebooks
    # sharing a GPU do not each claim 90% of it: pass 0.9 for vLLM's behaviour.
    gpu_memory_utilization: float | None = knob(None, "device cuda: the fraction of device "
                                                      "memory for this engine (vLLM: 0.9)")
    memory_reserve_bytes: int = knob(0, "headroom held back from a budget (fragmentation)")

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ValueError(
                f"block_size ({self.block_size}) must be one of 1, 2, 4, 8, 16, 32, 64, 128"
            )
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 2:
            raise ValueError(
                f"num_gpu_blocks_override ({self.num_gpu_blocks_override}) must be >= 2 "
                "(block 0 is the reserved null block)"
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(
                f"kv_cache_memory_bytes ({self.kv_cache_memory_bytes}) must be a positive integer"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            hint = " (only e4m3 is implemented)" if self.kv_cache_dtype == "fp8_e5m2" else ""
            raise ValueError(
                f"kv_cache_dtype ({self.kv_cache_dtype!r}) must be one of "
                f"{', '.join(repr(d) for d in KV_CACHE_DTYPES)}{hint}"
            )
        if not isinstance(self.calculate_kv_scales, bool):
            raise ValueError(
                f"calculate_kv_scales ({self.calculate_kv_scales!r}) must be True or False"
            )
        if self.calculate_kv_scales and not self.is_fp8_kv:
            raise ValueError(
                f"calculate_kv_scales (True) only applies to an fp8 KV cache; kv_cache_dtype is "
                f"{self.kv_cache_dtype!r} (pass kv_cache_dtype='fp8' or leave it False)"
            )
        b = self.cpu_memory_budget_bytes
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b <= 0):
            raise ValueError(f"cpu_memory_budget_bytes ({b!r}) must be a positive integer")
        u = self.gpu_memory_utilization
        if u is not None and (
            isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1
        ):
            raise ValueError(f"gpu_memory_utilization ({u!r}) must be a number in (0, 1]")
        r = self.memory_reserve_bytes
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ValueError(f"memory_reserve_bytes ({r!r}) must be an integer >= 0")
        budget = [n for n in ("cpu_memory_budget_bytes", "gpu_memory_utilization")
                  if getattr(self, n) is not None]
        direct = [n for n in ("num_gpu_blocks_override", "kv_cache_memory_bytes")
                  if getattr(self, n) is not None]
        if len(budget) > 1 or (budget and direct):
            both = budget + direct
            raise ValueError(
                f"{both[0]} and {both[1]} both size the KV pool; pass only one of "
                "num_gpu_blocks_override, kv_cache_memory_bytes, cpu_memory_budget_bytes "
                "(device='cpu') or gpu_memory_utilization (device='cuda')"
            )
        if r and not budget:
            raise ValueError(
                f"memory_reserve_bytes ({r}) only applies with a budget "
                "(cpu_memory_budget_bytes or gpu_memory_utilization)"
            )

    @property
    def is_fp8_kv(self) -> bool:
        return self.kv_cache_dtype in ("fp8", "fp8_e4m3")


@dataclass
class SchedulerConfig:
    """vLLM V1 scheduling: one token budget per step."""

    max_num_seqs: int = knob(256, "most requests running at once")
    max_num_batched_tokens: int | None = knob(None, "the per-step token budget (default: 8192 "
                                                    "with chunked prefill, else max_model_len)")
    enable_chunked_prefill: bool = knob(True, "split a prefill that does not fit the budget "
                                              "over several steps")
    long_prefill_token_threshold: int = knob(0, "cap one prefill chunk at this many tokens "
                                                "(0 = off)")
    policy: str = knob("fcfs", "fcfs | priority (lower priority value first); vLLM's "
                               "scheduling_policy")
    preemption_mode: str = knob("recompute", "recompute (vLLM V1: free the blocks, recompute "
                                             "later) | swap (write them to the host KV tier, "
                                             "read back; needs an OffloadingConnector)")
    max_model_len: int = 2048  # filled from ModelConfig by EngineConfig

    def __post_init__(self) -> None:
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode ({self.preemption_mode!r}) must be one of "
                             f"{', '.join(PREEMPTION_MODES)}")
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs ({self.max_num_seqs}) must be an integer >= 1")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"policy ({self.policy!r}) must be one of "
                             f"{', '.join(SCHEDULING_POLICIES)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) must be >= 0"
            )
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = (
                max(8192, self.max_num_seqs) if self.enable_chunked_prefill
                else max(self.max_model_len, 8192)
            )
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= 1"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}); raise it or lower max_num_seqs"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill off, so a long "
                "prompt could never be scheduled; raise it, lower max_model_len, or set "
                "enable_chunked_prefill=True"
            )


DISTRIBUTED_EXECUTOR_BACKENDS = ("mp", "ray", "external_launcher")


@dataclass
class ParallelConfig:
    """Tensor parallelism (workbench.distributed): one request's weights and compute split over
    `tensor_parallel_size` processes, one per device (CPU: gloo, CUDA: NCCL).

    distributed_executor_backend: "mp" = the engine process is rank 0 and spawns the other
    ranks as worker processes (it schedules; they run the same batch); "ray" = the same, with
    ranks 1..N-1 Ray actors in one placement group, on any nodes of a Ray cluster (needs the
    `cluster` extra); "external_launcher" = every rank was started by torchrun and runs the
    same deterministic engine (vLLM's names).
    """

    tensor_parallel_size: int = knob(1, "processes (devices) one model is split over")
    distributed_executor_backend: str = knob("mp", "mp (this process spawns the ranks) | "
                                                   "ray (Ray actors, any nodes) | "
                                                   "external_launcher (torchrun started them)")

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor_parallel_size ({tp!r}) must be an integer >= 1")
        if self.distributed_executor_backend not in DISTRIBUTED_EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend ({self.distributed_executor_backend!r}) must be "
                f"one of {', '.join(repr(b) for b in DISTRIBUTED_EXECUTOR_BACKENDS)}"
            )
        if self.distributed_executor_backend == "ray" and not ray_installed():
            raise ValueError(
                "distributed_executor_backend ('ray') needs Ray, which is not installed: "
                f"{CLUSTER_EXTRA} (or use 'mp': the ranks as processes on this machine)"
            )

    def verify_with_model_config(self, mc: ModelConfig) -> None:
        """The model's heads must split evenly: attention heads by tp; KV heads by tp (shard)
        or tp by KV heads (replicate, tp > kv heads); intermediate_size by tp."""
        tp = self.tensor_parallel_size
        if tp == 1:
            return
        heads, kv = mc.num_attention_heads, mc.num_kv_heads
        kv_ok = tp % kv == 0 if tp > kv else kv % tp == 0
        if heads % tp or not kv_ok:
            raise ValueError(
                f"tensor_parallel_size ({tp}) does not fit the model's heads: "
                f"num_attention_heads ({heads}) must be divisible by it, and "
                f"num_key_value_heads ({kv}) must be divisible by it (sharded) or divide it "
                f"(replicated, when tp > num_key_value_heads); pick a tp that does"
            )
        inter = int(mc.hf_config.get("intermediate_size", 0))
        if inter % tp:
            raise ValueError(
                f"tensor_parallel_size ({tp}) must divide the model's intermediate_size "
                f"({inter})"
            )


SPEC_METHODS = ("ngram", "draft_model")
ATTENTION_BACKENDS = ("torch", "triton")


@dataclass
class SpeculativeConfig:
    """vLLM's `speculative_config` dict, validated.

    {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a,
     "prompt_lookup_max": b}  or  {"method": "draft_model", "model": DIR,
     "num_speculative_tokens": k}. The draft must share the target's tokenizer; that is
    checked when the engine loads it (the target folder is needed).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 5
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_config method ({self.method!r}) must be one of "
                f"{', '.join(SPEC_METHODS)}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 32:
            raise ValueError(
                f"speculative_config num_speculative_tokens ({k!r}) must be an integer in 1..32"
            )
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError(
                    f"speculative_config model ({self.model!r}) is only for method "
                    "'draft_model'; n-gram drafts come from the prompt"
                )
            for name in ("prompt_lookup_min", "prompt_lookup_max"):
                v = getattr(self, name)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise ValueError(
                        f"speculative_config {name} ({v!r}) must be an integer >= 1"
                    )
            # vLLM's defaults: both missing -> 5 and 5; one missing -> the other's value.
            if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
                self.prompt_lookup_min = self.prompt_lookup_max = 5
            elif self.prompt_lookup_min is None:
                self.prompt_lookup_min = self.prompt_lookup_max
            elif self.prompt_lookup_max is None:
                self.prompt_lookup_max = self.prompt_lookup_min
            assert self.prompt_lookup_min is not None and self.prompt_lookup_max is not None
            if self.prompt_lookup_min > self.prompt_lookup_max:
                raise ValueError(
                    f"speculative_config prompt_lookup_min ({self.prompt_lookup_min}) must be "
                    f"<= prompt_lookup_max ({self.prompt_lookup_max})"
                )
        else:
            if self.model is not None:
                self.model = resolve_model(self.model)
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError(
                    "speculative_config prompt_lookup_min/prompt_lookup_max are only for "
                    "method 'ngram'"
                )
            if not self.model or not (Path(self.model) / "config.json").is_file():
                raise ValueError(
                    f"speculative_config model ({self.model!r}) must be a local model folder "
                    "with config.json for method 'draft_model'"
                )

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | SpeculativeConfig) -> SpeculativeConfig:
        if isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError(
                f"speculative_config ({spec!r}) must be a dict such as "
                "{'method': 'ngram', 'num_speculative_tokens': 5}"
            )
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - allowed)
        if unknown:
            raise ValueError(
                f"speculative_config has unknown key(s) {', '.join(unknown)}; allowed: "
                f"{', '.join(sorted(allowed))}"
            )
        if "method" not in spec:
            raise ValueError(
                f"speculative_config needs 'method' (one of {', '.join(SPEC_METHODS)})"
            )
        return cls(**spec)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None}


# EngineConfig fields that are knobs themselves (the sub-configs' fields are the others):
# what `from_kwargs`, the CLI flags and the template check accept at the top level.
TOP_LEVEL_KNOBS = ("speculative_config", "enforce_eager", "device", "attention_backend",
                   "kv_transfer_config", "compilation_config")


@dataclass
class EngineConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parallel_config: ParallelConfig
    speculative_config: SpeculativeConfig | dict[str, Any] | None = knob(
        None, 'JSON: {"method": "ngram" | "draft_model", "num_speculative_tokens": k, ...}')
    enforce_eager: bool = knob(False, "no CUDA graphs for decode and no torch.compile (eager "
                                      "every step; overrides compilation_config)")
    device: str = knob("cpu", "cpu | cuda (default: cuda when available)")
    attention_backend: str | None = knob(None, "torch | triton (default: torch on CPU, triton "
                                               "on CUDA)")
    kv_transfer_config: KVTransferConfig | dict[str, Any] | None = knob(
        None, 'JSON: {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", '
              '"kv_connector_extra_config": {"cpu_bytes_to_use": N, ...}}')
    compilation_config: CompilationConfig | dict[str, Any] | int | None = knob(
        None, 'torch.compile of the model forward (vLLM\'s): a mode 0 (NONE, eager) | 1 | 3 '
              '(VLLM_COMPILE) or JSON {"mode": 3, "backend": "inductor", "compile_sizes": '
              '[...], "cache_dir": DIR}; -O N is the mode alone (default: as measured for the '
              'model on this machine on CPU, else eager; eager on CUDA; docs/compile.md)')
    # why the mode is what it is when nobody set it (compile_choice.measured_default); None
    # when compilation_config, enforce_eager or TP decided
    compilation_default: str | None = field(default=None, init=False, repr=False,
                                            compare=False)

    def __post_init__(self) -> None:
        if self.speculative_config is not None:
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        if self.kv_transfer_config is not None:
            self.kv_transfer_config = KVTransferConfig.from_dict(self.kv_transfer_config)
        self._check_kv_transfer()
        self.parallel_config.verify_with_model_config(self.model_config)
        if self.parallel_config.tensor_parallel_size > 1 and self.speculative_config is not None:
            raise ValueError(
                f"speculative_config with tensor_parallel_size "
                f"({self.parallel_config.tensor_parallel_size}) is not supported yet; use "
                "tensor_parallel_size=1 or no speculative_config"
            )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device ({self.device!r}) must be 'cpu' or 'cuda'")
        self._resolve_compilation()
        if self.attention_backend is None:
            self.attention_backend = "triton" if self.device == "cuda" else "torch"
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend ({self.attention_backend!r}) is unknown; allowed: "
                f"{', '.join(ATTENTION_BACKENDS)} (default: torch on CPU, triton on CUDA)"
            )
        cc = self.cache_config
        if self.device == "cuda" and cc.cpu_memory_budget_bytes is not None:
            raise ValueError(
                f"cpu_memory_budget_bytes ({cc.cpu_memory_budget_bytes}) is for device='cpu'; "
                "on CUDA pass gpu_memory_utilization (a fraction of device memory)"
            )
        if self.device == "cpu" and cc.gpu_memory_utilization is not None:
            raise ValueError(
                f"gpu_memory_utilization ({cc.gpu_memory_utilization}) is for device='cuda'; "
                "on CPU pass cpu_memory_budget_bytes (a byte budget)"
            )

    def _resolve_compilation(self) -> None:
        """compilation_config -> a CompilationConfig with its mode decided: enforce_eager -> 0
        (overriding an explicit mode, as vLLM), else the device default; refuse what the
        compiled forward cannot run."""
        # a copy: a CompilationConfig passed to several engines is never changed under them
        cc = replace(CompilationConfig.from_any(self.compilation_config))  # type: ignore[arg-type]
        self.compilation_config = cc
        if self.enforce_eager and cc.compiles:
            logger.warning("enforce_eager=True overrides compilation_config mode %s: the model "
                           "runs eager", cc.describe())
            cc.mode = CompilationMode.NONE
        tp = self.parallel_config.tensor_parallel_size
        if cc.mode is None:  # a default never asks for what cannot run
            eager = self.enforce_eager or tp > 1
            if eager:
                cc.mode = CompilationMode.NONE
            else:
                measured, self.compilation_default = measured_default(
                    self.device, self.model_config.hf_config, self.torch_dtype_name)
                cc.mode = default_mode(self.device, measured)
        if cc.compiles and tp > 1:
            raise ValueError(
                f"compilation_config mode {cc.describe()} with tensor_parallel_size ({tp}) is "
                "not supported yet (the all-reduces would sit inside the compiled graph); "
                "use compilation_config 0 or tensor_parallel_size=1"
            )

    def _check_kv_transfer(self) -> None:
        """What the KV connector needs from the rest of the config (refused up front)."""
        kt = self.kv_transfer_config
        assert not isinstance(kt, dict)
        if self.scheduler_config.preemption_mode == "swap" and (
                kt is None or kt.offloading is None):
            raise ValueError("preemption_mode ('swap') needs a host KV tier: kv_transfer_config "
                             '{"kv_connector": "OffloadingConnector", ...}; or use '
                             "preemption_mode='recompute'")
        if kt is None:
            return
        off = kt.offloading
        bs = self.cache_config.block_size
        if off is not None and off.block_size is not None and off.block_size % bs:
            raise ValueError(f"kv_transfer_config kv_connector_extra_config block_size "
                             f"({off.block_size}) must be a multiple of block_size ({bs})")
        name = kt.kv_connector
        if self.parallel_config.tensor_parallel_size > 1:
            raise ValueError(f"kv_transfer_config ({name}) with "
                             f"tensor_parallel_size ({self.parallel_config.tensor_parallel_size})"
                             " is not supported yet; use tensor_parallel_size=1")
        spec = self.speculative_config
        if spec is not None and not isinstance(spec, dict) and spec.method != "ngram":
            raise ValueError(f"kv_transfer_config ({name}) with a draft model "
                             "(speculative_config method 'draft_model') is not supported: the "
                             "draft model's KV is not handed over; use method 'ngram'")

    @property
    def compilation(self) -> CompilationConfig:
        """compilation_config, resolved (a CompilationConfig with its mode decided)."""
        cc = self.compilation_config
        assert isinstance(cc, CompilationConfig), "EngineConfig.__post_init__ resolves it"
        return cc

    @property
    def quantization(self) -> str | None:
        """The target's weight quantization; it lives on ModelConfig (as in vLLM), so a draft
        model (its own ModelConfig) stays unquantized."""
        return self.model_config.quantization

    @property
    def torch_dtype_name(self) -> str:
        d = self.model_config.dtype
        if d == "auto":
            return "bfloat16" if self.device == "cuda" else "float32"
        return d

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineConfig:
        """Build from `LLM(model, **kwargs)`; an unknown keyword is a ValueError.
        `scheduling_policy` (vLLM's name) is accepted for `policy`."""
        if "scheduling_policy" in kwargs:
            kwargs = dict(kwargs)
            alias = kwargs.pop("scheduling_policy")
            if "policy" in kwargs and kwargs["policy"] != alias:
                raise ValueError(
                    f"scheduling_policy ({alias!r}) and policy ({kwargs['policy']!r}) name the "
                    "same knob; give one"
                )
            kwargs["policy"] = alias
        known: dict[type, set[str]] = {
            ModelConfig: {f.name for f in fields(ModelConfig)} - {"model", "hf_config"},
            CacheConfig: {f.name for f in fields(CacheConfig)},
            SchedulerConfig: {f.name for f in fields(SchedulerConfig)} - {"max_model_len"},
            ParallelConfig: {f.name for f in fields(ParallelConfig)},
        }
        top = set(TOP_LEVEL_KNOBS)
        allowed = set().union(*known.values()) | top
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise ValueError(
                f"unknown engine argument(s) {', '.join(unknown)}; allowed: "
                f"{', '.join(sorted(allowed))}"
            )
        pick = {c: {k: v for k, v in kwargs.items() if k in names} for c, names in known.items()}
        model_config = ModelConfig(model=os.fspath(model), **pick[ModelConfig])
        device = kwargs.get("device") or ("cuda" if _cuda_available() else "cpu")
        assert model_config.max_model_len is not None
        return cls(
            model_config=model_config,
            cache_config=CacheConfig(**pick[CacheConfig]),
            scheduler_config=SchedulerConfig(
                max_model_len=model_config.max_model_len, **pick[SchedulerConfig]
            ),
            parallel_config=ParallelConfig(**pick[ParallelConfig]),
            speculative_config=kwargs.get("speculative_config"),
            enforce_eager=bool(kwargs.get("enforce_eager", False)),
            device=device,
            attention_backend=kwargs.get("attention_backend"),
            kv_transfer_config=kwargs.get("kv_transfer_config"),
            compilation_config=kwargs.get("compilation_config"),
        )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
