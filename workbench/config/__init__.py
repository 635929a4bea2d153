"""Engine configuration (vLLM's `vllm/config/`): one module per config concept, each a
dataclass with vLLM's knob names, validated on construction.

    model.py           ModelConfig (the folder, its config.json, max_model_len), QuantConfig
    cache.py           CacheConfig: the paged KV cache and the memory budget it is sized from
    scheduler.py       SchedulerConfig: the per-step token budget, policy, preemption
    parallel.py        ParallelConfig: tensor parallelism and how its ranks are started
    speculative.py     SpeculativeConfig: n-gram or draft-model speculation
    compilation.py     CompilationConfig: torch.compile of the forward (modes, backend, sizes)
    compile_choice.py  the measured compiled-or-eager default on this machine
    kv_transfer.py     KVTransferConfig: the KV connector (offloading tiers, P2P handover)
    kv_transfer_params.py  a request's kv_transfer_params, validated
    engine.py          EngineConfig: all of the above for one engine (vLLM's VllmConfig)
    named_models.py    the model folders the workbench ships, by name ("bundled", "demo")
    utils.py           knob(): a field that is an engine knob (its help, what it accepts)

A bottom layer: it imports no engine code and no torch (`import workbench.config` and a
CacheConfig or SchedulerConfig work with torch absent; ModelConfig reads only JSON). After
validation every resolved knob holds its resolved type (`max_model_len`,
`max_num_batched_tokens`, `attention_backend` are never None; `speculative_config` and
`kv_transfer_config` are parsed configs or None; `compilation_config` has its mode decided).
"""

from workbench.config.cache import KV_CACHE_DTYPES, CacheConfig
from workbench.config.compilation import CompilationConfig, CompilationMode
from workbench.config.engine import ATTENTION_BACKENDS, TOP_LEVEL_KNOBS, EngineConfig
from workbench.config.kv_transfer import KVTransferConfig, OffloadingConfig, P2pConfig
from workbench.config.kv_transfer_params import kv_transfer_params
from workbench.config.model import ModelConfig, QuantConfig
from workbench.config.named_models import NAMED_MODELS, resolve_model
from workbench.config.parallel import ParallelConfig
from workbench.config.scheduler import PREEMPTION_MODES, SCHEDULING_POLICIES, SchedulerConfig
from workbench.config.speculative import SPEC_METHODS, SpeculativeConfig
from workbench.config.utils import knob

__all__ = [
    "ATTENTION_BACKENDS",
    "KV_CACHE_DTYPES",
    "NAMED_MODELS",
    "PREEMPTION_MODES",
    "SCHEDULING_POLICIES",
    "SPEC_METHODS",
    "TOP_LEVEL_KNOBS",
    "CacheConfig",
    "CompilationConfig",
    "CompilationMode",
    "EngineConfig",
    "KVTransferConfig",
    "ModelConfig",
    "OffloadingConfig",
    "P2pConfig",
    "ParallelConfig",
    "QuantConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "knob",
    "kv_transfer_params",
    "resolve_model",
]
