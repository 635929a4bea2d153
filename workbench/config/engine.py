"""EngineConfig: every sub-config of one engine plus the knobs that span them (vLLM's
`VllmConfig`), validated together on construction.

`EngineConfig.from_kwargs(**LLM kwargs)` splits the flat `LLM(...)` keywords into the
sub-configs; each sub-config checks its own fields in `__post_init__`, this class checks what
spans them (speculation or a KV connector with TP, the device's memory knobs) and resolves the
defaults that depend on several (the attention backend, the compilation mode). Every check
raises one `ValueError` naming the field, the value and what is allowed.

After validation the resolved fields hold their resolved types: `speculative_config` and
`kv_transfer_config` are a SpeculativeConfig / KVTransferConfig or None (a dict was parsed),
`compilation_config` is a CompilationConfig with its mode decided, `attention_backend` a name.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any

from workbench.config.cache import CacheConfig
from workbench.config.compilation import CompilationConfig, CompilationMode, default_mode
from workbench.config.compile_choice import measured_default
from workbench.config.kv_transfer import KVTransferConfig
from workbench.config.model import ModelConfig
from workbench.config.parallel import ParallelConfig
from workbench.config.scheduler import SchedulerConfig
from workbench.config.speculative import SpeculativeConfig
from workbench.config.utils import knob

ATTENTION_BACKENDS = ("torch", "triton")
logger = logging.getLogger(__name__)

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
    speculative_config: SpeculativeConfig | None = knob(
        None, 'JSON: {"method": "ngram" | "draft_model", "num_speculative_tokens": k, ...}',
        accepts=SpeculativeConfig | dict[str, Any] | None)
    enforce_eager: bool = knob(False, "no CUDA graphs for decode and no torch.compile (eager "
                                      "every step; overrides compilation_config)")
    device: str = knob("cpu", "cpu | cuda (default: cuda when available)")
    attention_backend: str = knob(None, "torch | triton (default: torch on CPU, triton on "
                                        "CUDA)", accepts=str | None)
    kv_transfer_config: KVTransferConfig | None = knob(
        None, 'JSON: {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", '
              '"kv_connector_extra_config": {"cpu_bytes_to_use": N, ...}}',
        accepts=KVTransferConfig | dict[str, Any] | None)
    compilation_config: CompilationConfig = knob(
        None, 'torch.compile of the model forward (vLLM\'s): a mode 0 (NONE, eager) | 1 | 3 '
              '(VLLM_COMPILE) or JSON {"mode": 3, "backend": "inductor", "compile_sizes": '
              '[...], "cache_dir": DIR}; -O N is the mode alone (default: as measured for the '
              'model on this machine on CPU, else eager; eager on CUDA; docs/compile.md)',
        accepts=CompilationConfig | dict[str, Any] | int | str | None)
    # why the mode is what it is when nobody set it (compile_choice.measured_default); None
    # when compilation_config, enforce_eager or TP decided
    compilation_default: str | None = field(default=None, init=False, repr=False,
                                            compare=False)

    def __post_init__(self) -> None:
        # the inputs as given (`accepts`: a dict, a mode, None), resolved in place below
        spec: SpeculativeConfig | dict[str, Any] | None = self.speculative_config
        kt: KVTransferConfig | dict[str, Any] | None = self.kv_transfer_config
        backend: str | None = self.attention_backend
        self.speculative_config = None if spec is None else SpeculativeConfig.from_dict(spec)
        self.kv_transfer_config = None if kt is None else KVTransferConfig.from_dict(kt)
        self._check_kv_transfer()
        self._check_kv_compression()
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
        if backend is None:
            backend = "triton" if self.device == "cuda" else "torch"
        self.attention_backend = backend
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend ({backend!r}) is unknown; allowed: "
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
        given: CompilationConfig | dict[str, Any] | int | str | None = self.compilation_config
        cc = replace(CompilationConfig.from_any(given))
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
        if spec is not None and spec.method != "ngram":
            raise ValueError(f"kv_transfer_config ({name}) with a draft model "
                             "(speculative_config method 'draft_model') is not supported: the "
                             "draft model's KV is not handed over; use method 'ngram'")

    def _check_kv_compression(self) -> None:
        """What KV eviction (cache_config.kv_compression_config) cannot run with, refused
        before any work starts (docs/kv_compression.md)."""
        kc = self.cache_config.kv_compression_config
        if kc is None:
            return
        what = f"kv_compression_config (method {kc.method!r})"
        if self.speculative_config is not None:
            raise ValueError(
                f"{what} with speculative_config ({self.speculative_config.method}) is not "
                "supported: drafts' lookahead slots and rejected tokens' rollback assume an "
                "uncompressed table; pass speculative_config=None or no kv_compression_config")
        if self.kv_transfer_config is not None:
            raise ValueError(
                f"{what} with kv_transfer_config ({self.kv_transfer_config.kv_connector}) is "
                "not supported: a connector copies whole block tables by logical position; "
                "pass kv_transfer_config=None or no kv_compression_config")
        tp = self.parallel_config.tensor_parallel_size
        if tp > 1:
            raise ValueError(
                f"{what} with tensor_parallel_size ({tp}) is not supported yet (attention "
                "scores would need a reduction across ranks); use tensor_parallel_size=1")
        dtype = self.cache_config.kv_cache_dtype
        if dtype in ("int8", "int4", "int2"):
            raise ValueError(
                f"{what} with kv_cache_dtype ({dtype!r}) is not supported yet (KIVI's "
                "full-precision residual follows the uncompressed table); use "
                "kv_cache_dtype 'auto' or 'fp8' with it")

    @property
    def compilation(self) -> CompilationConfig:
        """compilation_config (resolved: a CompilationConfig with its mode decided)."""
        return self.compilation_config

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
        # the knobs __post_init__ resolves, as given (None: the default; see `knob(accepts=)`)
        inputs: dict[str, Any] = {k: kwargs.get(k) for k in (
            "speculative_config", "attention_backend", "kv_transfer_config", "compilation_config")}
        return cls(
            model_config=model_config,
            cache_config=CacheConfig(**pick[CacheConfig]),
            scheduler_config=SchedulerConfig(
                max_model_len=model_config.max_model_len, **pick[SchedulerConfig]
            ),
            parallel_config=ParallelConfig(**pick[ParallelConfig]),
            enforce_eager=bool(kwargs.get("enforce_eager", False)),
            device=device,
            **inputs,
        )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
